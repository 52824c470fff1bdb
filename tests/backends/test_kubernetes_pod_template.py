"""A backend's pod template merged into the Jobs it makes (the cncf-kubernetes provider's merge),
with the backend's precedence, and bad templates refused at config load naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend
from iris_airflow_provider.backends.kubernetes.manifests import JobPlacement, JobTemplate
from iris_airflow_provider.backends.kubernetes.names import JOB_KEY_LABEL, QUEUE_LABEL
from iris_airflow_provider.backends.kubernetes.pod_template import PodTemplateError, checked_pod_template
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import parse_job

TEMPLATE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"labels": {"team": "ml", JOB_KEY_LABEL: "forged"}, "annotations": {"owner": "platform"}},
    "spec": {
        "serviceAccountName": "iris-workload",
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "secure"},
        "tolerations": [{"key": "secure", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
        "restartPolicy": "Always",
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}},
        ],
        "containers": [
            {
                "name": "base",
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                    {"name": "REGION", "value": "eu"},
                ],
                "envFrom": [{"secretRef": {"name": "wandb"}}],
                "volumeMounts": [
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {"name": "datasets", "mountPath": "/data", "readOnly": True},
                ],
            }
        ],
    },
}


def manifest(pod_template: dict[str, Any] | None, **job: Any) -> dict[str, Any]:
    spec = parse_job(
        {
            "job_id": "/alice/train",
            "command": "python train.py",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 2}, "cpu": 4},
            "priority_band": "interactive",
            **job,
        }
    )
    template = JobTemplate(
        backend_id="k8s",
        queue_name="iris",
        priority_classes={Band.INTERACTIVE: "iris-interactive"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        image="busybox:1.36",
        env={"REGION": "us", "TEAM": "default"},
        pod_template=checked_pod_template(pod_template) if pod_template else None,
    )
    submission = Submission(spec.job_id, "n1", spec, "marin", 1_000)
    return template.job_manifest(submission, JobPlacement("h100", "gpu.product", ("H100",)), "iris")


def test_the_templates_additions_are_kept_and_the_backends_fields_win() -> None:
    plain = manifest(None)
    merged = manifest(TEMPLATE)
    pod, plain_pod = merged["spec"]["template"], plain["spec"]["template"]
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    plain_container = plain_pod["spec"]["containers"][0]

    # The template's additions.
    assert spec["serviceAccountName"] == "iris-workload"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["nodeSelector"] == {"pool": "secure"}
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000}
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    ours = [v["name"] for v in plain_pod["spec"]["volumes"]]
    assert [v["name"] for v in spec["volumes"]] == ["dshm", "datasets", *ours]
    assert container["volumeMounts"][:2] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "datasets", "mountPath": "/data", "readOnly": True},
    ]
    assert container["volumeMounts"][2:] == plain_container["volumeMounts"]
    # Tolerations: the backend's and the template's.
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "secure", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["annotations"]["owner"] == "platform"

    # What the backend relies on.
    assert spec["restartPolicy"] == "Never"
    assert container["name"] == "job"
    for field in ("command", "resources", "image"):
        assert container[field] == plain_container[field]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert pod["metadata"]["labels"][JOB_KEY_LABEL] == plain_pod["metadata"]["labels"][JOB_KEY_LABEL]
    assert pod["metadata"]["annotations"] == {**plain_pod["metadata"]["annotations"], "owner": "platform"}
    assert spec["priorityClassName"] == "iris-interactive"
    assert spec["affinity"] == plain_pod["spec"]["affinity"]
    assert merged["metadata"]["labels"][QUEUE_LABEL] == "iris"  # the Job's own metadata is the backend's
    assert merged["metadata"] == plain["metadata"]
    assert {k: v for k, v in merged["spec"].items() if k != "template"} == {
        k: v for k, v in plain["spec"].items() if k != "template"
    }


def test_the_templates_env_is_the_peers_and_a_job_cannot_replace_it() -> None:
    pod = manifest(TEMPLATE, env={"HF_TOKEN": "stolen", "REGION": "mars", "EPOCHS": "3"})["spec"]["template"]
    env = pod["spec"]["containers"][0]["env"]
    names = [entry["name"] for entry in env]
    assert len(names) == len(set(names)), "one entry per name: the first would otherwise be shadowed"
    by_name = {entry["name"]: entry for entry in env}
    assert by_name["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert by_name["REGION"] == {"name": "REGION", "value": "eu"}  # over the job's and the backend's env
    assert by_name["EPOCHS"] == {"name": "EPOCHS", "value": "3"}  # the job's own
    assert by_name["TEAM"] == {"name": "TEAM", "value": "default"}  # the backend's default
    assert by_name["IRIS_JOB_ID"]["value"] == "/alice/train"
    assert "valueFrom" in by_name["IRIS_REPLICA_INDEX"]


def test_a_job_without_a_command_does_not_take_the_templates_container_fields() -> None:
    # The template may not set them at all (checked below); a minimal template changes nothing else.
    plain = manifest(None, command=[])
    merged = manifest({"spec": {"nodeSelector": {"pool": "a"}}}, command=[])
    assert "command" not in merged["spec"]["template"]["spec"]["containers"][0]
    plain["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    assert merged == plain


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("serviceAccountName: x", "must be a Pod manifest (a mapping with metadata and spec), got str"),
        ({"spec": {}, "kind": "Deployment"}, "kind must be Pod, got 'Deployment'"),
        ({"spec": {}, "data": {}}, "unknown field(s) data; accepted: apiVersion, kind, metadata, spec"),
        (
            {"spec": {"serviceAcountName": "x"}},
            "spec.serviceAcountName: not a field of a Kubernetes Pod (check its spelling and place)",
        ),
        (
            {"spec": {"containers": [{"env": [{"name": "A", "valu": "b"}]}]}},
            "spec.containers[0].env[0].valu: not a field of a Kubernetes Pod",
        ),
        (
            {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}},
            "spec.containers: at most one container",
        ),
        ({"spec": {"containers": [{"command": ["sh"]}]}}, "spec.containers[0].command: set by the backend"),
        ({"spec": {"priorityClassName": "high"}}, "spec.priorityClassName: set by the backend"),
        ({"spec": {"subdomain": "x"}}, "spec.subdomain: set by the backend"),
        (
            {"spec": {"containers": [{"env": [{"name": "MASTER_ADDR", "value": "elsewhere"}]}]}},
            "spec.containers[0].env: MASTER_ADDR is the backend's",
        ),
        ({"spec": {"containers": [{"resources": {}}]}}, "spec.containers[0].resources: set by the backend"),
        (
            {"spec": {"volumes": [{"name": "iris-result", "emptyDir": {}}]}},
            "spec.volumes: the name 'iris-result' is the backend's",
        ),
        (
            {"spec": {"containers": [{"volumeMounts": [{"name": "x", "mountPath": "/iris/workdir/data"}]}]}},
            "spec.containers[0].volumeMounts: /iris/workdir/data is the backend's",
        ),
        (
            {"spec": {"containers": [{"env": [{"name": "IRIS_RESULT", "value": "/tmp/r"}]}]}},
            "spec.containers[0].env: IRIS_RESULT is the backend's",
        ),
        ({"spec": {"tolerations": "all"}}, "spec.tolerations: must be a list, got 'all'"),
        ({"spec": {"nodeSelector": ["a"]}}, "spec.nodeSelector: not a valid Pod"),
    ],
)
def test_a_bad_template_is_refused_naming_the_field(template: Any, message: str) -> None:
    with pytest.raises(PodTemplateError) as error:
        checked_pod_template(template)
    assert message in str(error.value)


def test_the_cluster_file_takes_a_template_inline_or_from_a_file_and_names_a_bad_one(tmp_path: Path) -> None:
    template_file = tmp_path / "pod.yaml"
    template_file.write_text(
        "apiVersion: v1\nkind: Pod\nspec:\n  serviceAccountName: iris-workload\n  nodeSelector: {pool: secure}\n"
    )
    base = {"id": "k", "kind": "kubernetes"}
    config = parse_cluster_config({"name": "m", "backends": [{**base, "pod_template_file": str(template_file)}]})
    backend = KubernetesBackend.from_config(config.backends[0])  # type: ignore[arg-type]
    assert backend.template.pod_template == {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"serviceAccountName": "iris-workload", "nodeSelector": {"pool": "secure"}},
    }
    inline = parse_cluster_config({"name": "m", "backends": [{**base, "pod_template": {"spec": {"hostIPC": True}}}]})
    assert KubernetesBackend.from_config(inline.backends[0]).template.pod_template == {"spec": {"hostIPC": True}}  # type: ignore[arg-type]

    where = "cluster configuration: backends[0]"
    with pytest.raises(SpecError) as bad:
        parse_cluster_config({"name": "m", "backends": [{**base, "pod_template": {"spec": {"nodeSelecter": {}}}}]})
    assert [(p.path, p.message) for p in bad.value.problems] == [
        (f"{where}.pod_template", "spec.nodeSelecter: not a field of a Kubernetes Pod (check its spelling and place)")
    ]
    template_file.write_text("spec:\n  containers: [{name: a}, {name: b}]\n")
    with pytest.raises(SpecError) as bad_file:
        parse_cluster_config({"name": "m", "backends": [{**base, "pod_template_file": str(template_file)}]})
    assert [p.path for p in bad_file.value.problems] == [f"{where}.pod_template_file"]
    assert "spec.containers: at most one container" in bad_file.value.problems[0].message
    with pytest.raises(SpecError) as missing:
        parse_cluster_config({"name": "m", "backends": [{**base, "pod_template_file": str(tmp_path / "nope.yaml")}]})
    assert missing.value.problems[0].message.startswith(f"cannot read {tmp_path / 'nope.yaml'}")
    with pytest.raises(SpecError) as both:
        parse_cluster_config(
            {"name": "m", "backends": [{**base, "pod_template": {"spec": {}}, "pod_template_file": str(template_file)}]}
        )
    assert [(p.path, p.message) for p in both.value.problems] == [
        (f"{where}.pod_template_file", "give pod_template or pod_template_file, not both")
    ]


def test_the_readmes_pod_template_is_valid_and_kept() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Kubernetes backend", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "kind: Pod" in b]
    example = yaml.safe_load(block)
    pod = manifest(example)["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "iris-workload"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]

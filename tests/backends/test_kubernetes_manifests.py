"""What the ``kubernetes`` backend asks the API server for a job's rendezvous (pure manifests; the
contract suite runs them on the real control plane): a job of one replica is its own coordinator
and gets no Service; a job's own env may set the torch names itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from devtools.kube_command_node import _subdomain_on_loopback
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.config import KubernetesBackendConfig
from iris_airflow_provider.backends.kubernetes.gcs_bundles import GcsBundleStore
from iris_airflow_provider.backends.kubernetes.manifests import JobPlacement, JobTemplate
from iris_airflow_provider.backends.kubernetes.names import (
    BUNDLE_CONTAINER,
    COMPLETION_INDEX,
    job_name,
    rendezvous_service_name,
)
from iris_airflow_provider.core.model import parse_job

RANK_FROM_INDEX = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}


def manifest(replicas: int, env: dict[str, str] | None = None, port: int = 29500) -> dict[str, Any]:
    spec = parse_job(
        {"job_id": "/alice/train", "command": "train", "resources": {"replicas": replicas}, "env": env or {}}
    )
    template = JobTemplate(backend_id="default", image="busybox:1.36", coordinator_port=port)
    return template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(), "iris")


def container_env(job: dict[str, Any]) -> dict[str, Any]:
    [container] = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_replicas_meet_at_replica_0s_hostname_under_the_jobs_service() -> None:
    job = manifest(2, port=4242)
    service = rendezvous_service_name(job_name("/alice/train"), "n1")
    assert job["spec"]["template"]["spec"]["subdomain"] == service and len(service) <= 63
    env = container_env(job)
    coordinator = f"{job_name('/alice/train')}-0.{service}"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["IRIS_NUM_REPLICAS"]) == (
        coordinator,
        "4242",
        "2",
        "2",
    )
    assert env["IRIS_COORDINATOR_ADDRESS"] == f"{coordinator}:4242"
    assert env["IRIS_REPLICA_INDEX"] == env["RANK"] == env["NODE_RANK"] == RANK_FROM_INDEX


def test_a_single_replica_is_its_own_coordinator_without_a_subdomain() -> None:
    job = manifest(1)
    assert "subdomain" not in job["spec"]["template"]["spec"]
    env = container_env(job)
    assert (env["IRIS_COORDINATOR_ADDRESS"], env["MASTER_ADDR"], env["WORLD_SIZE"]) == (
        "127.0.0.1:29500",
        "127.0.0.1",
        "1",
    )


def test_the_jobs_env_may_set_the_torch_names_but_not_the_replica_index() -> None:
    env = container_env(manifest(2, env={"MASTER_PORT": "1234", "RANK": "7"}))
    assert (env["MASTER_PORT"], env["RANK"]) == ("1234", "7")
    assert env["IRIS_REPLICA_INDEX"] == env["NODE_RANK"] == RANK_FROM_INDEX


def test_the_coordinator_port_must_be_a_tcp_port() -> None:
    with pytest.raises(ValidationError, match="coordinator_port"):
        KubernetesBackendConfig.model_validate({"id": "k", "kind": "kubernetes", "coordinator_port": 70000})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"serving_port_base": 80}, "serving_port_base\n  Input should be greater than or equal to 1024"),
        ({"serving_port_base": 65530}, "serving_port_base\n  Input should be less than or equal to 65519"),
        ({"serving_port_base": 29490}, "ports 29490-29505 would include coordinator_port 29500; move one of them"),
    ],
)
def test_the_serving_ports_are_tcp_ports_clear_of_the_coordinator(settings: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KubernetesBackendConfig.model_validate({"id": "k", "kind": "kubernetes", **settings})


def test_named_ports_are_numbered_from_the_backends_serving_port_base() -> None:
    spec = parse_job({"job_id": "/alice/serve", "command": "serve", "ports": [{"name": "http"}, {"name": "metrics"}]})
    template = JobTemplate(backend_id="default", image="busybox:1.36", serving_port_base=9100)
    job = template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(), "iris")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert [port["containerPort"] for port in container["ports"]] == [9100, 9101]
    assert (container_env(job)["IRIS_PORT_HTTP"], container_env(job)["IRIS_PORT_METRICS"]) == ("9100", "9101")


def test_the_command_node_resolves_only_pod_names_of_the_pods_subdomain_to_loopback() -> None:
    pod = SimpleNamespace(spec=SimpleNamespace(subdomain="iris-train-1a2b"), metadata=SimpleNamespace(namespace="ns"))
    env = {
        "A": "iris-train-0.iris-train-1a2b",
        "B": "iris-train-0.iris-train-1a2b:29500",
        "C": "iris-train-1.iris-train-1a2b.ns.svc.cluster.local:80",
        "D": "iris-train-0.other-service:29500",
        "E": "iris-train-0.iris-train-1a2b.other-ns.svc:1",
        "F": "see iris-train-0.iris-train-1a2b",
    }
    assert _subdomain_on_loopback(env, pod) == {
        **env,
        "A": "127.0.0.1",
        "B": "127.0.0.1:29500",
        "C": "127.0.0.1:80",
    }
    assert _subdomain_on_loopback(env, SimpleNamespace(spec=SimpleNamespace(subdomain=None))) == env


def tpu_manifest(variant: str, replicas: int = 1) -> dict[str, Any]:
    spec = parse_job(
        {
            "job_id": "/alice/tpu",
            "command": "train",
            "resources": {"device": {"type": "tpu", "variant": variant}, "replicas": replicas},
        }
    )
    template = JobTemplate(backend_id="gke", image="busybox:1.36")
    return template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(variant), "iris")


def test_a_multi_host_tpu_slice_runs_one_pod_per_host_on_its_gke_nodes() -> None:
    job = tpu_manifest("v5p-16")  # 8 chips: 2 hosts of 4
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    [container] = pod["containers"]
    assert container["resources"] == {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}
    service = rendezvous_service_name(job_name("/alice/tpu"), "n1")
    assert pod["subdomain"] == service
    env = container_env(job)
    hosts = [f"{job_name('/alice/tpu')}-{index}.{service}" for index in range(2)]
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(hosts)
    assert env["TPU_WORKER_ID"] == env["IRIS_REPLICA_INDEX"] == RANK_FROM_INDEX
    assert (env["WORLD_SIZE"], env["IRIS_NUM_REPLICAS"], env["IRIS_DEVICE_VARIANT"]) == ("2", "2", "v5p-16")
    assert job["spec"]["template"]["metadata"]["labels"]["iris.marin.community/device-variant"] == "v5p-16"


def test_single_host_tpu_slices_run_one_pod_each_with_all_their_chips() -> None:
    job = tpu_manifest("v6e-8", replicas=2)  # two single-host slices of 8 chips
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "8"}
    env = container_env(job)
    assert "TPU_WORKER_HOSTNAMES" not in env and "TPU_WORKER_ID" not in env  # libtpu needs none on one host


def test_a_pod_templates_node_selector_joins_the_slices_labels_which_win() -> None:
    spec = parse_job(
        {"job_id": "/alice/tpu", "command": "train", "resources": {"device": {"type": "tpu", "variant": "v5p-16"}}}
    )
    topology = "cloud.google.com/gke-tpu-topology"
    template = JobTemplate(
        backend_id="gke",
        image="busybox:1.36",
        pod_template={"apiVersion": "v1", "kind": "Pod", "spec": {"nodeSelector": {"pool": "tpu", topology: "4x4x4"}}},
    )
    job = template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement("v5p-16"), "iris")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "tpu",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        topology: "2x2x2",
    }


def test_named_ports_are_container_ports_the_job_reads_from_its_env() -> None:
    spec = parse_job({"job_id": "/alice/serve", "command": "serve", "ports": [{"name": "http"}, {"name": "metrics"}]})
    template = JobTemplate(backend_id="default", image="busybox:1.36")
    job = template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(), "iris")
    [container] = job["spec"]["template"]["spec"]["containers"]
    numbers = [p["containerPort"] for p in container["ports"]]
    env = container_env(job)
    assert [env["IRIS_PORT_HTTP"], env["IRIS_PORT_METRICS"]] == [str(n) for n in numbers]
    assert len(set(numbers)) == 2 and 29500 not in numbers
    assert "ports" not in manifest(1)["spec"]["template"]["spec"]["containers"][0]


def test_a_bundled_job_fetches_its_bundle_into_its_workdir_before_it_starts() -> None:
    digest = "sha256:" + "ab" * 32
    spec = parse_job(
        {"job_id": "/alice/big", "command": ["python", "train.py"], "bundle": {"digest": digest, "size": 9}}
    )
    store = GcsBundleStore("gs://acme-iris/bundles")
    template = JobTemplate(
        backend_id="default",
        image="busybox:1.36",
        env={"HTTPS_PROXY": "http://proxy:3128"},
        bundle_store=store,
        bundle_fetch_image="python:3.12-slim",
    )
    pod = template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(), "iris")["spec"][
        "template"
    ]["spec"]

    (init,) = pod["initContainers"]
    assert init["name"] == BUNDLE_CONTAINER and init["image"] == "python:3.12-slim"
    assert init["command"][:2] == ["python3", "-c"] and "def main()" in init["command"][2]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {
        "HTTPS_PROXY": "http://proxy:3128",  # the backend's env reaches the fetch too
        "IRIS_BUNDLE_URL": f"gs://acme-iris/bundles/sha256/{'ab' * 32}",
        "IRIS_BUNDLE_DIGEST": digest,
        "IRIS_BUNDLE_DIR": "/iris/workdir",
    }
    (job,) = pod["containers"]
    assert job["workingDir"] == "/iris/workdir"
    shared = {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in job["volumeMounts"]}
    assert shared == {"workdir"}
    assert {"name": "workdir", "emptyDir": {}} in pod["volumes"]


def test_a_job_without_a_bundle_has_no_init_container() -> None:
    spec = parse_job({"job_id": "/alice/small", "command": ["true"]})
    template = JobTemplate(backend_id="default", image="busybox:1.36", bundle_store=GcsBundleStore("gs://acme-iris"))
    pod = template.job_manifest(Submission(spec.job_id, "n1", spec, "marin", 0), JobPlacement(), "iris")["spec"][
        "template"
    ]["spec"]
    assert "initContainers" not in pod

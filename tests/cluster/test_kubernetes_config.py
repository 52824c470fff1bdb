"""Kubernetes backends in the cluster file: parsed, built into backends, and bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend
from iris_airflow_provider.cluster.build import build_local_backends, build_peers
from iris_airflow_provider.cluster.config import KubernetesBackendConfig, load_cluster_config, parse_cluster_config
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.errors import SpecError

CLUSTER = """\
name: marin
backends:
  - {id: cpu, kind: process}
  - id: k8s-local
    kind: kubernetes
    conn_id: kube_local
    variant: H100
peers:
  - id: cw-h100
    kind: agentless
    backends:
      - id: default
        kind: kubernetes
        conn_id: kube_cw
        namespace: iris
        queue_name: iris
        priority_classes: {interactive: iris-interactive, PRIORITY_BAND_BATCH: iris-batch}
        other_priority_classes: {team-x: batch}
        variant_label: node.kubernetes.io/instance-type
        variant_values: {gd-8xh100ib-i128: H100}
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        image: busybox:1.36
        files_in: secret
        max_files_bytes: 500000
        ttl_seconds_after_finished: 600
"""


def problems(error: pytest.ExceptionInfo[SpecError]) -> dict[str, str]:
    return {problem.path: problem.message for problem in error.value.problems}


def test_kubernetes_backends_are_parsed_and_built(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    config = load_cluster_config(path)
    remote = config.peers[0].backends[0]
    assert isinstance(remote, KubernetesBackendConfig)
    assert remote.band_classes() == {Band.INTERACTIVE: "iris-interactive", Band.BATCH: "iris-batch"}
    assert remote.class_bands() == {
        "team-x": Band.BATCH,
        "iris-interactive": Band.INTERACTIVE,
        "iris-batch": Band.BATCH,
    }
    assert remote.variant_values == {"gd-8xh100ib-i128": "h100"}  # variants are lowercased
    local = build_local_backends(config)["k8s-local"]
    assert isinstance(local, KubernetesBackend)
    assert (local.api.conn_id, local.policy.variant, local.queue_name) == ("kube_local", "h100", "")
    [backend] = build_peers(config)["cw-h100"].backends.values()  # type: ignore[attr-defined]
    assert isinstance(backend, KubernetesBackend)
    assert (backend.api.conn_id, backend.api.namespace, backend.files_in, backend.max_files_bytes) == (
        "kube_cw",
        "iris",
        "secret",
        500_000,
    )
    assert backend.policy.band_of_class == {
        "team-x": Band.BATCH,
        "iris-interactive": Band.INTERACTIVE,
        "iris-batch": Band.BATCH,
    }
    assert backend.tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert backend.advertised() == {"device-type": ["gpu"], "device-variant": ["h100"]}


def test_bad_kubernetes_settings_are_named_with_what_is_accepted() -> None:
    document = {
        "name": "marin",
        "peers": [
            {
                "id": "cw",
                "kind": "agentless",
                "backends": [
                    {
                        "id": "default",
                        "kind": "kubernetes",
                        "namespace": "Has_Caps",
                        "priority_classes": {"urgent": "x"},
                        "variant": "h100",
                        "variant_label": "bad key!",
                        "files_in": "volume",
                        "max_files_bytes": 2_000_000,
                        "tolerations": [{"key": "a", "operator": "Maybe"}],
                        "gpus": 8,
                    }
                ],
            }
        ],
    }
    with pytest.raises(SpecError) as error:
        parse_cluster_config(document, source="c.yaml")
    found = problems(error)
    where = "c.yaml: peers[0].backends[0]"
    assert found[where].startswith("unknown field(s) gpus; accepted: id, kind, conn_id, namespace, queue_name")
    assert found[f"{where}.namespace"].startswith("must be a Kubernetes object name")
    assert found[f"{where}.priority_classes"].startswith("unknown priority band 'urgent'; accepted: production")
    assert found[f"{where}.variant_label"].startswith("must be a Kubernetes label key such as nvidia.com/gpu.product")
    assert found[f"{where}.files_in"] == "must be one of: configmap or secret"
    assert found[f"{where}.max_files_bytes"] == "must be <= 1048576"
    assert found[f"{where}.tolerations[0].operator"] == "must be one of: Equal or Exists"


def test_variant_settings_must_agree() -> None:
    base = {"id": "k", "kind": "kubernetes"}
    where = "cluster configuration: backends[0]"
    with pytest.raises(SpecError) as both:
        parse_cluster_config({"name": "m", "backends": [{**base, "variant": "h100", "variant_label": "gpu"}]})
    assert problems(both) == {f"{where}.variant_label": "give variant or variant_label, not both"}
    with pytest.raises(SpecError) as orphan:
        parse_cluster_config({"name": "m", "backends": [{**base, "variant_values": {"a": "h100"}}]})
    assert problems(orphan) == {f"{where}.variant_values": "needs variant_label: the node label whose values these are"}
    with pytest.raises(SpecError) as unspecified:
        parse_cluster_config({"name": "m", "backends": [{**base, "other_priority_classes": {"x": "unspecified"}}]})
    assert problems(unspecified)[f"{where}.other_priority_classes"].startswith("'unspecified' is not a band")

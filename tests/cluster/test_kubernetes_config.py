"""Kubernetes backends in the cluster file: parsed, built into backends, and bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
    assert found[where].startswith("unknown field(s) gpus; accepted: id, kind, conn_id, gke, namespace, queue_name")
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


GKE_CLUSTER = """\
name: marin
backends:
  - id: v5p
    kind: kubernetes
    gke:
      gcp_conn_id: google_cloud_marin
      project_id: marin-tpu
      location: us-central2-b
      cluster_name: v5p-pool
      impersonation_chain: "iris@marin-tpu.iam.gserviceaccount.com, deploy@marin-tpu.iam.gserviceaccount.com"
      use_dns_endpoint: true
    queue_name: iris
"""


def test_a_gke_backend_is_parsed_and_built_without_reaching_google() -> None:
    config = parse_cluster_config(yaml.safe_load(GKE_CLUSTER))
    (remote,) = config.backends
    assert isinstance(remote, KubernetesBackendConfig)
    assert remote.gke is not None
    assert remote.gke.impersonation_chain == [  # the provider's comma-separated form, split
        "iris@marin-tpu.iam.gserviceaccount.com",
        "deploy@marin-tpu.iam.gserviceaccount.com",
    ]
    backend = build_local_backends(config)["v5p"]
    assert isinstance(backend, KubernetesBackend)
    assert backend.api.gke == remote.gke
    assert backend.api.namespace == "default"  # a Google Cloud connection names none; no call made
    assert backend.api._hook is None  # the cluster is fetched on first use, not when the file is loaded
    defaults = parse_cluster_config(
        {
            "name": "m",
            "backends": [{"id": "g", "kind": "kubernetes", "gke": {"location": "us-east5", "cluster_name": "c"}}],
        }
    ).backends[0]
    assert isinstance(defaults, KubernetesBackendConfig) and defaults.gke is not None
    assert (defaults.gke.gcp_conn_id, defaults.gke.project_id, defaults.gke.impersonation_chain) == (
        "google_cloud_default",
        None,  # the connection's project
        [],
    )
    assert (defaults.gke.use_dns_endpoint, defaults.gke.use_internal_ip, defaults.gke.api_endpoint) == (
        False,
        False,
        None,
    )


def test_bad_gke_settings_are_named_with_what_is_accepted() -> None:
    gke = {
        "gcp_conn_id": " ",
        "project_id": "X",
        "location": "central",
        "cluster_name": "Pool_1",
        "impersonation_chain": ["iris@p.iam.gserviceaccount.com", "not-an-email"],
        "use_dns_endpoint": True,
        "use_internal_ip": True,
        "api_endpoint": "container.example.com",
        "zone": "us-central1-a",
    }
    with pytest.raises(SpecError) as error:
        parse_cluster_config({"name": "m", "backends": [{"id": "g", "kind": "kubernetes", "gke": gke}]})
    where = "cluster configuration: backends[0].gke"
    assert problems(error) == {
        where: "unknown field(s) zone; accepted: gcp_conn_id, project_id, location, cluster_name, "
        "impersonation_chain, use_dns_endpoint, use_internal_ip, api_endpoint",
        f"{where}.gcp_conn_id": "must name an Airflow connection of type google_cloud_platform",
        f"{where}.project_id": "must be a Google Cloud project id (6 to 30 lowercase letters, digits and hyphens,"
        " starting with a letter), got 'X'",
        f"{where}.location": "must be a Google Cloud region (us-central1) or zone (us-central1-a), got 'central'",
        f"{where}.cluster_name": "must be a GKE cluster name (up to 40 lowercase letters, digits and hyphens,"
        " starting with a letter), got 'Pool_1'",
        f"{where}.impersonation_chain": "must be service account emails (name@project.iam.gserviceaccount.com),"
        " got 'not-an-email'",
        f"{where}.use_internal_ip": "give use_dns_endpoint or use_internal_ip, not both",
        f"{where}.api_endpoint": "must be an http(s)://host[:port] URL, got 'container.example.com'",
    }
    with pytest.raises(SpecError) as missing:
        parse_cluster_config({"name": "m", "backends": [{"id": "g", "kind": "kubernetes", "gke": {}}]})
    assert set(problems(missing)) == {f"{where}.location", f"{where}.cluster_name"}


def test_a_backend_names_a_kubernetes_connection_or_a_gke_cluster_not_both() -> None:
    backend = {
        "id": "g",
        "kind": "kubernetes",
        "conn_id": "kube_gke",
        "gke": {"location": "us-east5", "cluster_name": "c"},
    }
    with pytest.raises(SpecError) as error:
        parse_cluster_config({"name": "m", "backends": [backend]})
    message = "give conn_id (a kubernetes connection) or gke (a GKE cluster), not both"
    assert problems(error) == {"cluster configuration: backends[0].gke": message}

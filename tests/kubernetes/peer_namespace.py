"""A namespace of the real control plane set up as the README asks a peer's administrator to: the
bands' PriorityClasses, a Kueue ClusterQueue (GPU quota, preemption of lower priorities) with a
LocalQueue, and the README's RBAC bound to a service account whose token is all the backend gets,
so a permission the README forgot fails the test that needs it.

    with peer_namespace(real_kube, "iris-contract", gpu_quota=8) as peer:
        monkeypatch.setenv("AIRFLOW_CONN_KUBE", peer.connection())
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.core.bands import Band

REPO = Path(__file__).resolve().parents[2]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "iris"  # the LocalQueue
SERVICE_ACCOUNT = "iris-federation"  # as in the README
PRIORITY_CLASSES = {"iris-batch": 100, "iris-interactive": 1000, "iris-production": 10000}
BAND_CLASSES = {Band.PRODUCTION: "iris-production", Band.INTERACTIVE: "iris-interactive", Band.BATCH: "iris-batch"}
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class PeerNamespace:
    kube: KubeCluster
    namespace: str
    kubeconfig: Path  # the service account's: its token and nothing else

    def connection(self) -> str:
        """An Airflow ``kubernetes`` connection (as ``AIRFLOW_CONN_<ID>`` JSON) acting as the service account."""
        extra = {"kube_config_path": str(self.kubeconfig), "namespace": self.namespace}
        return json.dumps({"conn_type": "kubernetes", "extra": extra})


def readme_rbac(namespace: str) -> list[dict[str, Any]]:
    """The README's RBAC documents for ``namespace``. Cluster-scoped names get the namespace as a
    suffix, so that several namespaces of one control plane each have their own."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Kubernetes backend", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "kind: ClusterRole" in b]
    assert len(blocks) == 1, "the README's Kubernetes section must hold one YAML block with the RBAC"
    documents = [d for d in yaml.safe_load_all(blocks[0]) if d]
    for document in documents:
        metadata = document["metadata"]
        if document["kind"].startswith("Cluster"):
            metadata["name"] = f"{metadata['name']}-{namespace}"
        else:
            metadata["namespace"] = namespace
        if "roleRef" in document and document["roleRef"]["kind"] == "ClusterRole":
            document["roleRef"]["name"] = f"{document['roleRef']['name']}-{namespace}"
        for subject in document.get("subjects", []):
            subject["namespace"] = namespace
    return documents


@contextlib.contextmanager
def peer_namespace(
    kube: KubeCluster,
    namespace: str,
    *,
    gpu_quota: int,
    tpu_quota: int | None = None,
    rbac: list[dict[str, Any]] | None = None,
) -> Iterator[PeerNamespace]:
    """Set ``namespace`` up (a ClusterQueue of ``gpu_quota`` GPUs named after it, the LocalQueue
    ``iris``, the README's RBAC unless given other documents), and on leaving delete it with
    everything in it and what it added to the cluster."""
    rbac = readme_rbac(namespace) if rbac is None else rbac
    with kube.admin_client() as admin:
        core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
        rbac_api = client.RbacAuthorizationV1Api(admin)
        try:
            _create(admin, rbac, namespace, gpu_quota, tpu_quota)
            yield PeerNamespace(kube, namespace, _service_account_kubeconfig(kube, core, namespace))
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespace(namespace, propagation_policy="Foreground")
            for document in rbac:
                if document["kind"] == "ClusterRole":
                    _gone(rbac_api.delete_cluster_role, document["metadata"]["name"])
                elif document["kind"] == "ClusterRoleBinding":
                    _gone(rbac_api.delete_cluster_role_binding, document["metadata"]["name"])
            _gone(custom.delete_cluster_custom_object, *KUEUE, "clusterqueues", namespace)
            _wait_gone(lambda: core.read_namespace(namespace), f"namespace {namespace}")


def _create(admin: Any, rbac: list[dict[str, Any]], namespace: str, gpu_quota: int, tpu_quota: int | None) -> None:
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    scheduling = client.SchedulingV1Api(admin)
    for name, value in PRIORITY_CLASSES.items():  # cluster-wide, shared by every namespace
        _exists_ok(scheduling.create_priority_class, {"metadata": {"name": name}, "value": value})
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}}
    _exists_ok(custom.create_cluster_custom_object, *KUEUE, "resourceflavors", flavor)
    # Kueue admits only what a ClusterQueue covers: CPU and memory without limit, GPUs as given.
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": str(gpu_quota)}
    if tpu_quota is not None:
        quota["google.com/tpu"] = str(tpu_quota)
    custom.create_cluster_custom_object(
        *KUEUE,
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": namespace},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {"name": "default", "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}
                        ],
                    }
                ],
            },
        },
    )
    custom.create_namespaced_custom_object(
        *KUEUE,
        namespace,
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE},
            "spec": {"clusterQueue": namespace},
        },
    )
    core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
    rbac_api = client.RbacAuthorizationV1Api(admin)
    create = {
        "ClusterRole": rbac_api.create_cluster_role,
        "ClusterRoleBinding": rbac_api.create_cluster_role_binding,
        "Role": lambda body: rbac_api.create_namespaced_role(namespace, body),
        "RoleBinding": lambda body: rbac_api.create_namespaced_role_binding(namespace, body),
    }
    for document in rbac:
        create[document["kind"]](document)


def _service_account_kubeconfig(kube: KubeCluster, core: client.CoreV1Api, namespace: str) -> Path:
    request = {"spec": {"expirationSeconds": 24 * 3600}}  # outlives any test session
    token = core.create_namespaced_service_account_token(SERVICE_ACCOUNT, namespace, request).status.token
    path = kube.directory / f"{namespace}-{SERVICE_ACCOUNT}.kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "peer",
                "clusters": [
                    {"name": "local", "cluster": {"server": kube.url, "certificate-authority": str(kube.pki.ca_path)}}
                ],
                "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
                "contexts": [
                    {"name": "peer", "context": {"cluster": "local", "user": SERVICE_ACCOUNT, "namespace": namespace}}
                ],
            }
        )
    )
    return path


def _exists_ok(create: Any, *args: Any) -> None:
    try:
        create(*args)
    except ApiException as error:
        if error.status != 409:
            raise


def _gone(delete: Any, *args: Any) -> None:
    try:
        delete(*args)
    except ApiException as error:
        if error.status != 404:
            raise


def _wait_gone(read: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            read()
        except ApiException as error:
            if error.status == 404:
                return
            raise
        time.sleep(0.25)
    raise RuntimeError(f"{what} still exists after {timeout:g} s")

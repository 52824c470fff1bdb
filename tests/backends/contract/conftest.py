"""Where the backend contract scenarios run: the ``process`` backend (always, on a fresh state
directory per test), the ``kubernetes`` backend against the real control plane of
``devtools/kube_cluster.py`` (Kueue included; skipped without its binaries unless
``IRIS_REQUIRE_KUBERNETES=1``), and against a cluster of yours when a kubeconfig is given
(``IRIS_KUBECONFIG``, else ``KUBECONFIG``; without one that target is not generated).

On the control plane the backend acts as a service account holding exactly the RBAC the README
documents (applied from its YAML), so every scenario passing there also proves the README asks for
enough. Its one schedulable H100 node runs each pod's real command (``kube_command_node``); the
cordoned and the tainted one are KWOK's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devtools.kube_cluster import KubeCluster, free_port
from iris_airflow_provider.backends.base import DEFAULT_COORDINATOR_PORT, Backend
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.backends.kubernetes.backend import JOB_KEY_LABEL, KubernetesBackend, job_key, job_name
from iris_airflow_provider.backends.kubernetes.manifests import SERVING_PORT_BASE
from iris_airflow_provider.backends.process.backend import ProcessBackend, job_directory_name
from iris_airflow_provider.core.bands import Band, parse_band
from tests.kubernetes.peer_namespace import BAND_CLASSES, H100, PRODUCT, QUEUE, peer_namespace


@dataclass
class Target:
    """What the scenarios run against, and how the backend is configured for it."""

    kind: str  # "process", or for Kubernetes "kube" (the control plane here) or "cluster" (yours)
    namespace: str
    admin: Any  # a kubernetes ApiClient allowed to set up and inspect (None for the process backend)
    queue_name: str = ""
    priority_classes: dict[Band, str] = field(default_factory=dict)
    variant: str = "h100"
    variant_label: str | None = None
    variant_value: str | None = None  # the label value of the variant, for test pods' node selectors
    image: str = "busybox:1.36"
    exclusive: bool = False  # the test may fill the variant's GPUs
    conn_id: str = "iris_kube_contract"
    state_dir: Path | None = None  # the process backend's
    slots: int = 8  # the process backend's device slots of the variant
    # Where replica 0 of a Kubernetes job listens: the control plane's pods share this machine's ports.
    coordinator_port: int = DEFAULT_COORDINATOR_PORT
    # Where a Kubernetes job's first named port listens: the same reason.
    serving_port_base: int = SERVING_PORT_BASE
    # A Kubernetes backend's bundle store (the GCS emulator's bucket here) and what its pods need
    # to reach it; None: it takes no workdir bundle.
    bundle_store: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    bundles_dir: Path | None = None

    @property
    def kubernetes(self) -> bool:
        return self.kind != "process"

    def backend(self, backend_id: str = "default", *, bundle_store: bool = True) -> Backend:
        if self.state_dir is not None:
            return ProcessBackend(
                backend_id,
                self.state_dir,
                devices={self.variant: self.slots},
                attributes={"region": ["test"]},
                bundles=BundleStore(self.state_dir.parent / "bundles"),
            )
        variant_values = {self.variant_value: self.variant} if self.variant_label and self.variant_value else None
        return KubernetesBackend(
            backend_id,
            conn_id=self.conn_id,
            namespace=self.namespace,
            queue_name=self.queue_name,
            priority_classes=self.priority_classes,
            variant=None if self.variant_label else self.variant,
            variant_label=self.variant_label,
            variant_values=variant_values,
            image=self.image,
            attributes={"region": ["test"]},
            coordinator_port=self.coordinator_port,
            serving_port_base=self.serving_port_base,
            env=self.env,
            bundle_store=self.bundle_store if bundle_store else None,
            bundle_gcp_conn_id="iris_bundles_gcs",
            bundles=BundleStore(self.bundles_dir) if self.bundles_dir else None,
        )

    def node_selector(self) -> dict[str, str]:
        return {self.variant_label: self.variant_value} if self.variant_label and self.variant_value else {}

    def incarnations(self, job_id: str) -> list[str]:
        """What the backend made for the job, by name: its Jobs, or its job directories."""
        if self.state_dir is not None:
            return sorted(path.name for path in (self.state_dir / "jobs").glob(job_directory_name(job_id) + "*"))
        from kubernetes import client

        jobs = client.BatchV1Api(self.admin).list_namespaced_job(
            self.namespace, label_selector=f"{JOB_KEY_LABEL}={job_key(job_id)}"
        )
        return [j.metadata.name for j in jobs.items]

    def object_name(self, job_id: str) -> str:
        """The name of the one thing a job's incarnation is made of here."""
        return job_directory_name(job_id) if self.state_dir is not None else job_name(job_id)

    def gpu_shape(self, backend: Backend) -> tuple[int, int]:
        """(the most GPUs of the variant one replica can have, how many replicas of that size fit)."""
        if isinstance(backend, KubernetesBackend):
            capacity = backend.capacity().variants[self.variant]
            return capacity.largest_node, capacity.total // capacity.largest_node
        return self.slots, 1  # one machine: all its slots


@pytest.fixture(scope="module")
def kube_target(
    real_kube: KubeCluster, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    try:  # the bundle store's emulator: without it only the bundle scenarios that need it skip
        gcs = request.getfixturevalue("gcs_emulator")
    except pytest.skip.Exception:
        gcs = None
    namespace = "iris-contract"
    nodes = ("h100-a", "h100-cordoned", "h100-maintenance")
    real_kube.create_command_node("h100-a", gpus=8, labels={PRODUCT: H100})
    real_kube.create_node("h100-cordoned", gpus=8, labels={PRODUCT: H100}, unschedulable=True)
    maintenance = {"key": "maintenance", "value": "true", "effect": "NoExecute"}
    real_kube.create_node("h100-maintenance", gpus=8, labels={PRODUCT: H100}, taints=[maintenance])
    try:
        with peer_namespace(real_kube, namespace, gpu_quota=8) as peer, pytest.MonkeyPatch.context() as patch:
            patch.setenv("AIRFLOW_CONN_IRIS_KUBE_CONTRACT", peer.connection())
            if gcs is not None:
                # Bundles go to the GCS emulator through the google provider's GCSHook (an anonymous
                # connection; the google clients honour STORAGE_EMULATOR_HOST), and the pods' init
                # containers fetch them from it.
                patch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
                anonymous = {"is_anonymous": True, "project": "iris-test"}
                patch.setenv(
                    "AIRFLOW_CONN_IRIS_BUNDLES_GCS",
                    json.dumps({"conn_type": "google_cloud_platform", "extra": anonymous}),
                )
            with real_kube.admin_client() as admin:
                yield Target(
                    kind="kube",
                    namespace=namespace,
                    admin=admin,
                    queue_name=QUEUE,
                    priority_classes=dict(BAND_CLASSES),
                    variant_label=PRODUCT,
                    variant_value=H100,
                    exclusive=True,
                    coordinator_port=free_port(),
                    serving_port_base=free_port(),
                    bundle_store="gs://iris-bundles/contract" if gcs is not None else None,
                    env={"STORAGE_EMULATOR_HOST": gcs.url} if gcs is not None else {},
                    bundles_dir=tmp_path_factory.mktemp("bundles"),
                )
    finally:
        for node in nodes:
            real_kube.delete_node(node)


@pytest.fixture(scope="session")
def cluster_target() -> Iterator[Target]:
    kubeconfig = _your_kubeconfig()
    assert kubeconfig, "the cluster target exists only when IRIS_KUBECONFIG (or KUBECONFIG) names one"
    from kubernetes import config

    namespace = os.environ.get("IRIS_K8S_NAMESPACE", "iris-contract")
    classes = json.loads(os.environ.get("IRIS_K8S_PRIORITY_CLASSES", "{}"))
    bands = {parse_band(band, unspecified=None): name for band, name in classes.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "AIRFLOW_CONN_IRIS_KUBE_CLUSTER",
            json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig, "namespace": namespace}}),
        )
        yield Target(
            kind="cluster",
            namespace=namespace,
            admin=config.new_client_from_config(config_file=kubeconfig),
            queue_name=os.environ.get("IRIS_K8S_QUEUE", ""),
            priority_classes={band: name for band, name in bands.items() if band is not None},
            variant=os.environ.get("IRIS_K8S_VARIANT", "h100"),
            variant_label=os.environ.get("IRIS_K8S_VARIANT_LABEL") or None,
            variant_value=os.environ.get("IRIS_K8S_VARIANT_VALUE") or None,
            image=os.environ.get("IRIS_K8S_IMAGE", "busybox:1.36"),
            exclusive=os.environ.get("IRIS_K8S_EXCLUSIVE") == "1",
            conn_id="iris_kube_cluster",
        )


@pytest.fixture
def process_target(tmp_path: Path) -> Iterator[Target]:
    state_dir = tmp_path / "process-backend"
    yield Target(kind="process", namespace="", admin=None, exclusive=True, state_dir=state_dir)
    # Stop whatever a failed scenario left running: each live job's process group, by the id recorded.
    for status_file in (state_dir / "jobs").glob("*/status.json"):
        status = json.loads(status_file.read_text())
        if status["state"] in ("starting", "running") and status.get("pgid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(status["pgid"], signal.SIGKILL)


def _your_kubeconfig() -> str | None:
    return os.environ.get("IRIS_KUBECONFIG") or os.environ.get("KUBECONFIG")


# Your cluster is a target only when you name one: a run without it has nothing to skip.
@pytest.fixture(params=["process", "kube", *(["cluster"] if _your_kubeconfig() else [])])
def target(request: pytest.FixtureRequest) -> Target:
    return request.getfixturevalue(f"{request.param}_target")

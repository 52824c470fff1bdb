"""Where the backend contract scenarios run: the ``process`` backend (always, on a fresh state
directory per test), the ``kubernetes`` backend against the in-repo fake API server (always), and
against a real cluster when a kubeconfig is given (``IRIS_KUBECONFIG``, else ``KUBECONFIG``);
without one those skip, saying so.

The fake's adapter token holds exactly the RBAC the README documents (parsed from its YAML), so
every scenario passing there also proves the README asks for enough.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.fake_kube import FakeKube
from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.backends.kubernetes.backend import JOB_KEY_LABEL, KubernetesBackend, job_key, job_name
from iris_airflow_provider.backends.process.backend import ProcessBackend, job_directory_name
from iris_airflow_provider.core.bands import Band, parse_band

REPO = Path(__file__).resolve().parents[3]
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT = "nvidia.com/gpu.product"
FAKE_CLASSES = {Band.PRODUCTION: "iris-production", Band.INTERACTIVE: "iris-interactive", Band.BATCH: "iris-batch"}


@dataclass
class Target:
    """What the scenarios run against, and how the backend is configured for it."""

    kind: str  # "process", or for Kubernetes "fake" or "cluster"
    namespace: str
    admin: Any  # a kubernetes ApiClient allowed to set up and inspect (None for the process backend)
    queue_name: str = ""
    priority_classes: dict[Band, str] = field(default_factory=dict)
    variant: str = "h100"
    variant_label: str | None = None
    variant_value: str | None = None  # the label value of the variant, for test pods' node selectors
    image: str = "busybox:1.36"
    exclusive: bool = False  # the test may fill the variant's GPUs
    fake: FakeKube | None = None
    conn_id: str = "iris_kube_fake"
    state_dir: Path | None = None  # the process backend's
    slots: int = 8  # the process backend's device slots of the variant

    @property
    def kubernetes(self) -> bool:
        return self.kind != "process"

    def backend(self, backend_id: str = "default") -> Backend:
        if self.state_dir is not None:
            return ProcessBackend(
                backend_id, self.state_dir, devices={self.variant: self.slots}, attributes={"region": ["test"]}
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


def readme_rbac_rules(namespace: str) -> list[dict[str, Any]]:
    """The RBAC rules of the README's Kubernetes section, as the fake API server enforces them."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Kubernetes backend", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "kind: ClusterRole" in b]
    assert len(blocks) == 1, "the README's Kubernetes section must hold one YAML block with the RBAC"
    rules = []
    for document in yaml.safe_load_all(blocks[0]):
        if document["kind"] not in ("ClusterRole", "Role"):
            continue
        scope = document["metadata"].get("namespace", "") if document["kind"] == "Role" else ""
        for rule in document["rules"]:
            rules.append({**rule, "namespace": namespace if scope else ""})
    return rules


@pytest.fixture(scope="session")
def fake_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    namespace = "iris"
    kube = FakeKube(
        tmp_path_factory.mktemp("fake-kube"),
        namespaces=["default", namespace],
        nodes=[
            {"name": "h100-a", "labels": {PRODUCT: H100}, "allocatable": {"nvidia.com/gpu": "8"}},
            {
                "name": "h100-cordoned",
                "labels": {PRODUCT: H100},
                "allocatable": {"nvidia.com/gpu": "8"},
                "unschedulable": True,
            },
            {
                "name": "h100-maintenance",
                "labels": {PRODUCT: H100},
                "allocatable": {"nvidia.com/gpu": "8"},
                "taints": [{"key": "maintenance", "value": "true", "effect": "NoExecute"}],
            },
        ],
        priority_classes={"iris-batch": 100, "iris-interactive": 1000, "iris-production": 10000},
        kueue={"local_queues": {f"{namespace}/iris": "gpus"}, "cluster_queues": {"gpus": {"nvidia.com/gpu": 8}}},
        adapter_rules=readme_rbac_rules(namespace),
    )
    with kube, pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_IRIS_KUBE_FAKE", kube.connection(namespace=namespace))
        yield Target(
            kind="fake",
            namespace=namespace,
            admin=kube.admin_client(),
            queue_name="iris",
            priority_classes=dict(FAKE_CLASSES),
            variant_label=PRODUCT,
            variant_value=H100,
            exclusive=True,
            fake=kube,
        )


@pytest.fixture(scope="session")
def cluster_target() -> Iterator[Target]:
    kubeconfig = os.environ.get("IRIS_KUBECONFIG") or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.skip(
            "no real cluster: set IRIS_KUBECONFIG (or KUBECONFIG) to run the Kubernetes contract suite against one"
        )
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


@pytest.fixture(params=["process", "fake", "cluster"])
def target(request: pytest.FixtureRequest) -> Target:
    return request.getfixturevalue(f"{request.param}_target")

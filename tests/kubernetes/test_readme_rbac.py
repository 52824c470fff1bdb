"""The README's RBAC is exactly enough: with it the backend does everything a peer asks of it, and
without any one of its permissions something fails, naming the permission it lacked.

The backend acts as a service account of the real control plane whose only rights are the
README's YAML (``peer_namespace.readme_rbac``), one permission taken out per case.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.api import KubernetesUnavailableError
from iris_airflow_provider.backends.kubernetes.backend import JOB_KEY_LABEL, KubernetesBackend
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from tests.kubernetes.peer_namespace import BAND_CLASSES, H100, PRODUCT, QUEUE, peer_namespace, readme_rbac
from tests.waiting import wait_for, wait_state

pytestmark = pytest.mark.kubernetes
NODE = "rbac-h100"
# (role kind, API group, resource, verb): every permission the README grants.
PERMISSIONS = [
    ("ClusterRole", "", "nodes", "list"),
    ("ClusterRole", "", "pods", "list"),
    ("Role", "batch", "jobs", "create"),
    ("Role", "batch", "jobs", "get"),
    ("Role", "batch", "jobs", "delete"),
    ("Role", "", "pods/log", "get"),
    ("Role", "", "configmaps", "create"),
    ("Role", "", "secrets", "create"),
    ("Role", "", "secrets", "list"),
    ("Role", "", "secrets", "patch"),
    ("Role", "", "services", "create"),
]


@pytest.fixture(scope="module")
def node(real_kube: KubeCluster) -> Iterator[KubeCluster]:
    real_kube.create_command_node(NODE, gpus=8, labels={PRODUCT: H100})
    yield real_kube
    real_kube.delete_node(NODE)


def granted(documents: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {
        (document["kind"], group, resource, verb)
        for document in documents
        if document["kind"] in ("ClusterRole", "Role")
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def without(documents: list[dict[str, Any]], permission: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    """The documents granting everything they did but ``permission``."""
    kind, group, resource, verb = permission
    documents = copy.deepcopy(documents)
    for document in documents:
        if document["kind"] != kind:
            continue
        rules = []
        for rule in document["rules"]:
            if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
                others = [r for r in rule["resources"] if r != resource]
                if others:
                    rules.append({**rule, "resources": others})
                verbs = [v for v in rule["verbs"] if v != verb]
                if verbs:
                    rules.append({**rule, "resources": [resource], "verbs": verbs})
            else:
                rules.append(rule)
        document["rules"] = rules
    return documents


def test_the_permissions_listed_here_are_the_readmes() -> None:
    assert granted(readme_rbac("x")) == set(PERMISSIONS)


def exercise(backend: KubernetesBackend) -> None:
    """What a peer asks of its backend: a heartbeat, a job of two replicas (a rendezvous Service) with
    files and a job token run to the end and its output read, its token renewed as the tick does,
    another started and cancelled."""
    backend.describe()
    done = job("cat greeting.txt", files={"greeting.txt": "hello\n"}, replicas=2)
    delivered = submission(done, job_env={"IRIS_FEDERATION_URL": "http://127.0.0.1:9", "IRIS_JOB_TOKEN": "t1"})
    backend.submit(delivered)
    wait_state(backend, done.job_id, JobState.SUCCEEDED, timeout=60)
    assert backend.logs(done.job_id).lines == ("[replica 0] hello", "[replica 1] hello")
    live = [(done.job_id, delivered.nonce)]
    assert backend.job_tokens_due(live, lambda expires: True) == set(live)  # "t1" is no JWT: renewed
    assert backend.write_job_token(done.job_id, delivered.nonce, "t2")
    running = job("sleep 300")
    backend.submit(submission(running))
    wait_state(backend, running.job_id, JobState.RUNNING, timeout=60)
    assert backend.cancel(running.job_id)
    wait_for(lambda: backend.status(running.job_id) is None, "the cancelled Job to go", timeout=60)


@pytest.mark.parametrize("permission", [None, *PERMISSIONS], ids=lambda p: "all" if p is None else f"no-{p[3]}-{p[2]}")
def test_each_permission_of_the_readme_is_needed(
    node: KubeCluster, monkeypatch: pytest.MonkeyPatch, permission: tuple[str, str, str, str] | None
) -> None:
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    documents = readme_rbac(namespace)
    if permission is not None:
        documents = without(documents, permission)
        assert permission not in granted(documents) and len(granted(documents)) == len(PERMISSIONS) - 1
    with peer_namespace(node, namespace, gpu_quota=8, rbac=documents) as peer, node.admin_client() as admin:
        monkeypatch.setenv("AIRFLOW_CONN_IRIS_KUBE_RBAC", peer.connection())
        backend = KubernetesBackend(
            "default",
            conn_id="iris_kube_rbac",
            namespace=namespace,
            queue_name=QUEUE,
            priority_classes=dict(BAND_CLASSES),
            variant_label=PRODUCT,
            variant_values={H100: "h100"},
            image="busybox:1.36",
        )
        if permission is None:
            exercise(backend)
            return
        _kind, _group, resource, verb = permission
        with pytest.raises(KubernetesUnavailableError, match="403 Forbidden") as failed:
            exercise(backend)
        # The API server's own words, relayed: the service account, the verb and the resource.
        message = str(failed.value)
        assert f'cannot {verb} resource "{resource}"' in message, message
        if verb == "create" and resource in ("configmaps", "secrets", "services"):
            # The Job made before them was taken back: nothing half-made.
            jobs = client.BatchV1Api(admin).list_namespaced_job(namespace, label_selector=JOB_KEY_LABEL)
            assert [j for j in jobs.items if j.metadata.deletion_timestamp is None] == []


def job(command: str, replicas: int = 1, **extra: Any) -> Any:
    return parse_job(
        {
            "job_id": f"/alice/rbac-{uuid.uuid4().hex[:8]}",
            "command": command,
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}, "replicas": replicas},
            **extra,
        }
    )


def submission(spec: Any, job_env: dict[str, str] | None = None) -> Submission:
    return Submission(spec.job_id, uuid.uuid4().hex, spec, "marin", int(time.time() * 1000), job_env=job_env or {})

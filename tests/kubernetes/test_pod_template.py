"""A backend's pod template on the real control plane: the Jobs it makes carry the peer's service
account, env from a Secret, a ``/dev/shm`` volume and node selector, and run on the node selected;
a job naming the template's variable does not replace the peer's credential."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend, job_name
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from tests.kubernetes.peer_namespace import QUEUE, peer_namespace
from tests.waiting import wait_state

pytestmark = pytest.mark.kubernetes
NAMESPACE = "iris-pod-template"
NODE = "secure-a"
SECRET_VALUE = "hf_s3cr3t-from-the-peer"
POD_TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "spec": {
        "serviceAccountName": "iris-workload",
        "nodeSelector": {"pool": "secure"},
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "containers": [
            {
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
    },
}


@pytest.fixture(scope="module")
def admin(real_kube: KubeCluster) -> Iterator[Any]:
    """The namespace as the README sets it up, plus what the peer's administrator adds for the
    template: the workload's service account, the Secret, and a node of the ``secure`` pool that
    runs its pods' commands (the only node with that label)."""
    real_kube.create_command_node(NODE, labels={"pool": "secure"})
    try:
        with peer_namespace(real_kube, NAMESPACE, gpu_quota=0) as peer, pytest.MonkeyPatch.context() as patch:
            patch.setenv("AIRFLOW_CONN_IRIS_KUBE_POD_TEMPLATE", peer.connection())
            with real_kube.admin_client() as admin:
                core = client.CoreV1Api(admin)
                core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "iris-workload"}})
                token = base64.b64encode(SECRET_VALUE.encode()).decode()
                secret = {"metadata": {"name": "hf"}, "data": {"token": token}}
                core.create_namespaced_secret(NAMESPACE, secret)
                yield admin
    finally:
        real_kube.delete_node(NODE)


def test_jobs_carry_the_peers_pod_template_and_a_job_cannot_override_its_credentials(admin: Any) -> None:
    backend = KubernetesBackend(
        "secure",
        conn_id="iris_kube_pod_template",
        namespace=NAMESPACE,
        queue_name=QUEUE,
        image="busybox:1.36",
        pod_template=POD_TEMPLATE,
    )
    spec = parse_job(
        {
            "job_id": f"/alice/template-{uuid.uuid4().hex[:8]}",
            "command": 'echo "token=$HF_TOKEN epochs=$EPOCHS"; test -d /dev/shm && echo shm',
            "resources": {"device": {"type": "cpu"}},
            "env": {"HF_TOKEN": "forged-by-the-job", "EPOCHS": "3"},
        }
    )
    backend.submit(Submission(spec.job_id, uuid.uuid4().hex, spec, "marin", 1_000))
    try:
        report = wait_state(backend, spec.job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=90)
        assert (report.state, report.exit_code, report.error) == (JobState.SUCCEEDED, 0, "")
        assert backend.logs(spec.job_id).lines == (
            f"[replica 0] token={SECRET_VALUE} epochs=3",  # the peer's Secret, not the job's value
            "[replica 0] shm",
        )
        selector = f"job-name={job_name(spec.job_id)}"
        (pod,) = client.CoreV1Api(admin).list_namespaced_pod(NAMESPACE, label_selector=selector).items
        assert pod.spec.node_name == NODE
        assert pod.spec.service_account_name == "iris-workload"
        assert pod.spec.node_selector == {"pool": "secure"}
        assert pod.spec.restart_policy == "Never"
        assert {v.name for v in pod.spec.volumes} >= {"dshm", "iris-result"}
        (container,) = pod.spec.containers
        assert ("dshm", "/dev/shm") in {(m.name, m.mount_path) for m in container.volume_mounts}
        hf_token = [e for e in container.env if e.name == "HF_TOKEN"]
        assert len(hf_token) == 1 and hf_token[0].value_from.secret_key_ref.name == "hf"
        job = client.BatchV1Api(admin).read_namespaced_job(job_name(spec.job_id), NAMESPACE)
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE  # admitted through Kueue
    finally:
        backend.cancel(spec.job_id)

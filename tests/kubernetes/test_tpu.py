"""TPU slices on the real control plane, with nodes labelled as GKE labels TPU hosts: the backend
reports their chips per slice variant, a v5p-16 job (2 hosts of 4 chips) runs one pod per host on
them, admitted by Kueue as one workload, each pod told its worker id and the slice's hostnames; and
placement gates TPU jobs by those chips."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.base import Submission, SubmissionRefusedError
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend, job_name
from iris_airflow_provider.backends.kubernetes.names import rendezvous_service_name
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.placement import Candidate, plan
from iris_airflow_provider.core.router import Disposition, classify
from iris_airflow_provider.core.states import JobState
from tests.kubernetes.peer_namespace import KUEUE, QUEUE, peer_namespace
from tests.waiting import wait_for, wait_state

pytestmark = pytest.mark.kubernetes
NAMESPACE = "iris-tpu"
V5P_16 = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice", "cloud.google.com/gke-tpu-topology": "2x2x2"}
HOSTS = ("tpu-v5p-16-a", "tpu-v5p-16-b")  # one v5p-16 slice: 2 hosts of 4 chips
CONN = "iris_kube_tpu"
STALENESS = 120_000


@pytest.fixture(scope="module")
def admin(real_kube: KubeCluster) -> Iterator[Any]:
    """The namespace as the README sets it up, with a ClusterQueue covering 8 TPU chips, and the two
    hosts of a v5p-16 slice as nodes that run their pods' commands (removed after the module:
    other modules count every node)."""
    try:
        for host in HOSTS:
            real_kube.create_command_node(host, tpus=4, labels=V5P_16)
        with (
            peer_namespace(real_kube, NAMESPACE, gpu_quota=0, tpu_quota=8) as peer,
            pytest.MonkeyPatch.context() as patch,
            real_kube.admin_client() as admin,
        ):
            patch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", peer.connection())
            yield admin
    finally:
        for host in HOSTS:
            real_kube.delete_node(host)


@pytest.fixture
def backend(admin: Any) -> KubernetesBackend:
    return KubernetesBackend("gke", conn_id=CONN, namespace=NAMESPACE, queue_name=QUEUE, image="busybox:1.36")


def tpu_job(name: str, variant: str = "v5p-16", replicas: int = 1, command: str = "true") -> JobSpec:
    device: dict[str, Any] = {"type": "tpu", "variant": variant}
    if variant == "auto":
        device["count"] = 4
    resources = {"device": device, "replicas": replicas}
    return parse_job({"job_id": f"/alice/{name}-{uuid.uuid4().hex[:6]}", "command": command, "resources": resources})


def peer_state(backend: KubernetesBackend, now_ms: int) -> PeerState:
    return PeerState("gke", True, now_ms, (backend.describe(),))


def test_the_slices_chips_are_reported_per_variant(backend: KubernetesBackend) -> None:
    described = backend.describe()
    assert described.advertised["device-type"] == ("tpu",)
    assert "v5p-16" in described.advertised["device-variant"]
    assert described.availability is not None
    assert described.availability.total_amounts["v5p-16"] == 8
    assert described.availability.amounts["v5p-16"] == 8


def test_a_multi_host_slice_runs_one_pod_per_host_with_its_worker_environment(
    admin: Any, backend: KubernetesBackend
) -> None:
    spec = tpu_job("v5p", command='echo "worker=$TPU_WORKER_ID of $WORLD_SIZE hosts=$TPU_WORKER_HOSTNAMES"')
    nonce = uuid.uuid4().hex
    backend.submit(Submission(spec.job_id, nonce, spec, "marin", 1_000))
    try:
        report = wait_state(backend, spec.job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
        assert (report.state, report.error) == (JobState.SUCCEEDED, "")
        name = job_name(spec.job_id)
        service = rendezvous_service_name(name, nonce)
        hosts = f"{name}-0.{service},{name}-1.{service}"
        assert sorted(backend.logs(spec.job_id).lines) == [
            f"[replica 0] worker=0 of 2 hosts={hosts}",
            f"[replica 1] worker=1 of 2 hosts={hosts}",
        ]
        job = client.BatchV1Api(admin).read_namespaced_job(name, NAMESPACE)
        assert (job.spec.completions, job.spec.parallelism, job.spec.completion_mode) == (2, 2, "Indexed")
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
        # Kueue admitted it as one workload of both hosts: the gang.
        workloads = client.CustomObjectsApi(admin).list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")
        (workload,) = [w for w in workloads["items"] if w["metadata"]["ownerReferences"][0]["name"] == name]
        assert [p["count"] for p in workload["spec"]["podSets"]] == [2]
        pods = client.CoreV1Api(admin).list_namespaced_pod(NAMESPACE, label_selector=f"job-name={name}").items
        assert sorted(pod.spec.node_name for pod in pods) == sorted(HOSTS)  # one pod per host
        for pod in pods:
            assert pod.spec.node_selector == V5P_16
            assert pod.spec.subdomain == service
            (container,) = pod.spec.containers
            assert container.resources.limits["google.com/tpu"] == "4"
            assert container.resources.requests["google.com/tpu"] == "4"
    finally:
        backend.cancel(spec.job_id)


def test_placement_gates_tpu_jobs_by_the_chips_the_backend_reports(backend: KubernetesBackend) -> None:
    now = 1_000_000
    # Two slices need 16 chips; the backend has 8 in all: rejected at submit, with the reason.
    two = tpu_job("two", replicas=2)
    decision = classify(two, local_backends=[], peers=[peer_state(backend, now)], now_ms=now, staleness_ms=STALENESS)
    assert decision.disposition is Disposition.REJECT
    assert decision.reason == (
        f"Job {two.job_id} needs 16 v5p-16 on one backend; the largest that can host it is gke/gke with 8 in total"
    )
    # While one slice runs, the next waits for its chips.
    running = tpu_job("holder", command="sleep 60")
    backend.submit(Submission(running.job_id, uuid.uuid4().hex, running, "marin", 1_000))
    try:
        wait_state(backend, running.job_id, JobState.RUNNING, timeout=60)
        waiting = tpu_job("waiting")
        placed = plan([Candidate.from_job(waiting, now)], [peer_state(backend, now)], now_ms=now)
        assert placed.promotions == ()
        assert [p.job_id for p in placed.pending] == [waiting.job_id]
    finally:
        backend.cancel(running.job_id)
    freed = wait_for(
        lambda: (state := peer_state(backend, now)).backends[0].availability.amounts.get("v5p-16") == 8 and state,
        "the slice's chips to be free again",
        timeout=60,
    )
    (promotion,) = plan([Candidate.from_job(tpu_job("next"), now)], [freed], now_ms=now).promotions
    assert (promotion.backend_id, dict(promotion.reserved)) == ("gke", {"v5p-16": 8})


def test_the_backend_refuses_what_it_cannot_run_as_a_slice(backend: KubernetesBackend) -> None:
    cases = {
        "auto": (tpu_job("auto", variant="auto"), "needs a TPU slice such as v5p-8"),
        "absent": (tpu_job("v6e", variant="v6e-16"), "has no v6e-16 TPU slices; it has v5p-16"),
        "multislice": (tpu_job("multi", replicas=2), "runs one multi-host slice per job"),
    }
    for spec, message in cases.values():
        with pytest.raises(SubmissionRefusedError, match=message):
            backend.submit(Submission(spec.job_id, uuid.uuid4().hex, spec, "marin", 1_000))

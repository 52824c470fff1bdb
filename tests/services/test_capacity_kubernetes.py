"""No double-booking on a Kubernetes peer whose Kueue holds the Jobs it is handed suspended.

The real control plane's ClusterQueue has no GPU quota, so Kueue admits nothing: every Job delivered
stays suspended, its pods hold no GPUs, and the cluster's 8 free GPUs are advertised on every
heartbeat. Without reservations that outlive an observation, each tick would hand it another job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend
from iris_airflow_provider.core.reservations import RESERVED_NOTE
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.services.job_views import job_explanation
from iris_airflow_provider.store.store import FederationStore
from tests.kubernetes.peer_namespace import BAND_CLASSES, H100, PRODUCT, PeerNamespace, peer_namespace
from tests.services.world import ALICE, World, spec, tick_until

NAMESPACE = "iris-capacity"
CONN_ID = "iris_kube_capacity"


pytestmark = pytest.mark.kubernetes


@pytest.fixture(scope="module")
def kube(real_kube: KubeCluster) -> Iterator[PeerNamespace]:
    real_kube.create_node("capacity-h100-0", gpus=8, labels={PRODUCT: H100})
    try:
        with peer_namespace(real_kube, NAMESPACE, gpu_quota=0) as peer:
            yield peer
    finally:
        real_kube.delete_node("capacity-h100-0")


@pytest.fixture
def world(
    tmp_path: Path, sqlite_store: FederationStore, kube: PeerNamespace, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", kube.connection())
    world = World(tmp_path, sqlite_store)
    yield world
    world.close()


def test_kueue_holding_suspended_jobs_gets_one_job_not_one_per_tick(world: World, kube: PeerNamespace) -> None:
    backend = KubernetesBackend(
        "default",
        conn_id=CONN_ID,
        namespace=NAMESPACE,
        queue_name="iris",
        priority_classes=dict(BAND_CLASSES),
        variant_label=PRODUCT,
        variant_values={H100: "h100"},
        image="busybox:1.36",
    )
    federation = world.federation({"cw-k8s": AgentlessPeer("cw-k8s", [backend], allowed_submitters=["*@example.com"])})
    for n in range(3):
        federation.submit(spec(f"/alice/train-{n}", "echo never", h100=8), submitting_user=ALICE)
    promoted = []
    epochs = set()
    for _ in range(3):
        report = federation.tick()
        promoted += report.promoted
        [state] = world.store.peer_states()
        epochs.add(state.backends[0].availability.observation_epoch_ms)
        world.clock.advance(1_000)
    assert promoted == ["/alice/train-0->cw-k8s/default"]
    # Delivered and suspended by Kueue: pending there, holding nothing; the cluster still shows 8 free,
    # as one observation (its numbers did not change), heartbeat after heartbeat.
    first = tick_until(federation, world.store, "/alice/train-0", JobState.PENDING)
    assert first.handoff_state is HandoffState.HANDED_OFF
    with kube.kube.admin_client() as admin:
        jobs = client.BatchV1Api(admin).list_namespaced_job(NAMESPACE).items
    assert [job.spec.suspend for job in jobs] == [True]
    assert backend.describe().availability.amounts == {"h100": 8}
    assert len(epochs) == 1
    for n in (1, 2):
        waiting = world.job(f"/alice/train-{n}")
        assert waiting.handoff_state is HandoffState.QUEUED
        explained = job_explanation(federation, waiting, world.clock())
        assert f"after 8 h100 {RESERVED_NOTE}" in explained["summary"]
    for n in range(3):
        federation.cancel(f"/alice/train-{n}")
    tick_until(federation, world.store, "/alice/train-0", JobState.KILLED)

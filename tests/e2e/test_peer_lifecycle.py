"""Lifecycle between two Airflow deployments (issue 12): a cancel racing a handoff, and a peer lost
and found again. Parent ``marin`` reaches peer ``cw-east`` through a loopback proxy that can hold
a request in flight; the parent settles a peer's jobs once it has been unreachable for 20 s.

Built like ``test_peer_federation``'s pair, with a short ``peer_lost_seconds`` (which that module's
api-server restart must never trip) and ticks every few seconds while jobs wait in the queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from devtools.airflow_deployment import COMPONENTS, AirflowDeployment
from devtools.fault_proxy import FaultProxy
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.identity import generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port
from tests.e2e.deployments import deployment_pair
from tests.e2e.test_peer_federation import gpu, on_peer
from tests.waiting import wait_for

_wait = partial(wait_for, timeout=180, interval=0.5)
UI_API = "/iris/federation/ui/api"
LOST_S = 20
LOST = reasons.peer_lost("cw-east", LOST_S * 1000)  # "Peer cw-east lost for 20 s; the job's state there is unknown"

pytestmark = pytest.mark.e2e
# On a busy machine a scheduler whose own heartbeat lags 10 s (the deployments' default threshold)
# resets its running tasks, and the reset task's kill cancels its job: not what these tests are about.
STEADY = {"AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "60"}


@dataclass
class Pair:
    parent: AirflowDeployment
    peer: AirflowDeployment
    parent_store: FederationStore
    peer_store: FederationStore
    proxy: FaultProxy
    root: Path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("lifecycle")
    for name in ("marin", "cw-east"):
        private, public = generate_keypair()
        (root / f"{name}.key").write_text(private)
        (root / f"{name}.pub").write_text(public)
    peer_port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{peer_port}").start()
    (root / "parent.yaml").write_text(
        f"""
name: marin
placement:
  tick_interval_seconds: 5
  sync_interval_seconds: 2
  peer_lost_seconds: {LOST_S}
  requeue_avoid_seconds: 5
federation: {{private_key: {root / "marin.key"}}}
backends: [{{id: cpu, kind: process, max_running_jobs: 4}}]
peers: [{{id: cw-east, kind: airflow, url: "{proxy.url}", allow_insecure_http: true}}]
"""
    )
    (root / "peer.yaml").write_text(
        f"""
name: cw-east
placement: {{sync_interval_seconds: 2}}
federation:
  private_key: {root / "cw-east.key"}
  trusted_peers:
    marin: {{public_key: {root / "marin.pub"}}}
  allowed_submitters: ["*@example.com", "alice"]
backends: [{{id: default, kind: process, devices: {{h100: 8}}}}]
"""
    )
    try:
        with deployment_pair(
            root, databases="iris_life", logs="lifecycle", peer_port=peer_port, extra_env=STEADY
        ) as running:
            yield Pair(running.parent, running.peer, running.parent_store, running.peer_store, proxy, root)
    finally:
        proxy.stop()


def job_of_run(pair: Pair, run_id: str) -> str:
    """The job a run submitted, from the parent's store (its XCom is pushed only when it ends)."""
    return _wait(
        lambda: next(
            (j.job_id for j in pair.parent_store.list_jobs(limit=1000) if j.origin and j.origin.run_id == run_id),
            None,
        ),
        f"the job of run {run_id}",
    )


def last_log(deployment: AirflowDeployment, run_id: str) -> str:
    """The log of the task's last try (a busy scheduler may reset a task and run it again)."""
    try_number = int(deployment.task_instance("e2e_job", run_id, "run").get("try_number") or 1)
    return deployment.task_log("e2e_job", run_id, "run", try_number=try_number)


def test_a_cancel_while_the_handoff_is_in_flight_reaches_the_job_on_the_peer(pair: Pair) -> None:
    parent, peer_store, parent_store = pair.parent, pair.peer_store, pair.parent_store
    hold = pair.proxy.hold_next(f"{API_PREFIX}/handoffs")
    run = parent.trigger("e2e_job", {"job": gpu("sleep 600")}, user="alice")
    _wait(hold.arrived.is_set, "the handoff to be in flight (held by the proxy)")
    job_id = job_of_run(pair, run)
    try:
        answer = parent.api("POST", f"{UI_API}/jobs/cancel", params={"job_id": job_id}, user="alice")
        assert answer.status_code == 200, answer.text
        # The peer did not have the job yet, and said so: no answer while the handoff may still land.
        assert answer.json()["result"] == "cancel_requested", answer.json()
        assert peer_store.get_job(on_peer(job_id)) is None
        job = parent_store.get_job(job_id)
        assert not job.terminal and job.cancel_requested and job.handoff_state is HandoffState.PENDING
    finally:
        hold.release()  # the handoff lands after the cancel
    _wait(
        lambda: (j := peer_store.get_job(on_peer(job_id))) is not None and j.state is JobState.KILLED,
        "the peer to kill the job that landed after the cancel",
    )
    _wait(lambda: parent_store.get_job(job_id).state is JobState.KILLED, "the parent to mirror the kill")
    assert parent_store.get_job(job_id).error == "Cancelled on peer cw-east"
    assert parent.wait_for_run("e2e_job", run) == "failed"
    log = last_log(parent, run)
    assert "Peer cw-east admitted the job while a cancel was requested" in log
    assert "Cancelled on peer cw-east" in log and reasons.CANCELLED_BEFORE_HANDOFF not in log


def test_a_lost_peer_settles_its_jobs_and_when_it_returns_what_it_held_is_terminated(pair: Pair) -> None:
    parent, peer, parent_store, peer_store = pair.parent, pair.peer, pair.parent_store, pair.peer_store
    marker = pair.root / "checkpointed"
    resumable = f"if [ -e {marker} ]; then echo resumed from checkpoint; else touch {marker}; sleep 600; fi"
    failing = parent.trigger("e2e_job", {"job": gpu("sleep 600")}, user="alice")
    moving = parent.trigger("e2e_job", {"job": gpu(resumable, on_peer_lost="requeue")}, user="alice")
    failing_job, moving_job = job_of_run(pair, failing), job_of_run(pair, moving)
    for job_id in (failing_job, moving_job):
        _wait(lambda j=job_id: parent_store.get_job(j).state is JobState.RUNNING, f"{job_id} to run on cw-east")
    old = {job_id: parent_store.get_job(job_id).nonce for job_id in (failing_job, moving_job)}

    for component in COMPONENTS:  # the peer deployment dies (its jobs' processes run on, detached)
        peer.kill_component(component)
    _wait(lambda: parent_store.get_job(failing_job).state is JobState.FAILED, "the job that ran there to fail")
    assert parent_store.get_job(failing_job).error == LOST
    assert parent.wait_for_run("e2e_job", failing) == "failed"
    assert LOST in last_log(parent, failing)
    _wait(lambda: parent_store.get_job(moving_job).nonce != old[moving_job], "the other to be requeued")
    moved = parent_store.get_job(moving_job)
    assert moved.handoff_state is HandoffState.QUEUED and moved.requeue_count == 1
    left = {(h.peer_id, h.job_id, h.nonce) for h in parent_store.abandoned_handoffs()}
    assert left == {("cw-east", job_id, nonce) for job_id, nonce in old.items()}

    peer.start()  # back: what it still runs of both is terminated there before anything new is placed
    _wait(lambda: parent_store.abandoned_handoffs() == [], "both superseded incarnations to be terminated there")
    for job_id in old:
        assert any(e.state == "killed" for e in peer_store.events(on_peer(job_id))), job_id
    assert parent.wait_for_run("e2e_job", moving, timeout=240) == "success"
    done = parent_store.get_job(moving_job)
    assert done.state is JobState.SUCCEEDED and done.peer_id == "cw-east" and done.nonce != old[moving_job]
    # On the peer: the old incarnation ended (killed) before the new one was admitted; nothing ran twice.
    history = [(e.kind, e.state) for e in peer_store.events(on_peer(moving_job))]
    killed = next(i for i, (_, state) in enumerate(history) if state == "killed")
    assert killed < next(i for i, (kind, _) in enumerate(history) if kind == "resubmitted"), history
    log = last_log(parent, moving)
    assert "Back in the queue: peer cw-east was lost" in log and "resumed from checkpoint" in log
    assert "Peer cw-east answered again and terminated the incarnation" in log

"""The Federation service end to end: a real store, agentless peers on real process backends, and
scripted or fake peers where a test needs a peer to fail, hang, refuse or forget a job.

Tests that take the ``store`` fixture run on SQLite and PostgreSQL; the rest on SQLite only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.grace import STALE_PROBE_COOLDOWN_MS
from iris_airflow_provider.core.handoff_policy import DELIVERY_BACKOFF_BASE_MS
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.router import Disposition
from iris_airflow_provider.core.router import classify as route
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.submit import LOCAL_ADMIN, IdentityError
from iris_airflow_provider.store.records import NewIncarnation
from tests.services.world import (
    ALICE,
    FakePeer,
    Jitter,
    ScriptedPeer,
    World,
    event_kinds,
    spec,
    tick_until,
)

# Submit: classify and enqueue -------------------------------------------------------------------


def test_a_job_a_local_backend_can_host_runs_here_and_the_tick_mirrors_its_end(world: World) -> None:
    federation = world.federation()
    ok = federation.submit(spec("/alice/prep", "echo ok"), submitting_user=ALICE)
    assert ok.decision.disposition is Disposition.LOCAL and ok.decision.local_backend_id == "cpu"
    assert ok.job is not None and not ok.reattached
    assert (ok.job.direction, ok.job.handoff_state, ok.job.backend_id) == (Direction.LOCAL, None, "cpu")
    assert ok.job.state in (JobState.ACCEPTED, JobState.RUNNING)  # started at submit, not on the tick
    bad = federation.submit(spec("/alice/bad", "exit 4"), submitting_user=ALICE)
    assert bad.decision.disposition is Disposition.LOCAL

    done = tick_until(federation, world.store, "/alice/prep", JobState.SUCCEEDED)
    assert done.exit_code == 0 and done.error == ""
    failed = tick_until(federation, world.store, "/alice/bad", JobState.FAILED)
    assert failed.exit_code == 4 and failed.error == "Replica 0 exited with code 4"
    assert all(peer.count("deliver") == 0 for peer in world.peers.values())


def test_a_job_only_a_peer_can_host_is_queued_then_promoted_delivered_and_mirrored(world: World) -> None:
    federation = world.federation()
    submitted = federation.submit(spec("/alice/train", "echo trained", h100=2), submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.QUEUE and submitted.decision.pinned_peer_id == ""
    job = submitted.job
    assert job is not None
    assert (job.direction, job.handoff_state, job.state, job.peer_id) == (
        Direction.SENT,
        HandoffState.QUEUED,
        JobState.PENDING,
        "",
    )
    assert job.pending_reason == reasons.QUEUED_UNPINNED
    assert world.peer_backend("cw-h100").status("/alice/train") is None  # nothing delivered at submit

    report = federation.tick()
    assert report.heartbeats == {"cw-h100": "ok", "cw-gb200": "ok"}
    assert report.promoted == ["/alice/train->cw-h100/default"]
    assert report.delivered == ["/alice/train"]
    handoff = world.peers["cw-h100"].handoffs[0]
    assert (handoff.nonce, handoff.requester, handoff.owner_principal, handoff.submitting_user) == (
        job.nonce,
        "marin",
        ALICE,
        ALICE,
    )
    assert handoff.backend_id == "default"
    assert world.job("/alice/train").handoff_state is HandoffState.HANDED_OFF
    assert world.job("/alice/train").peer_id == "cw-h100"

    done = tick_until(federation, world.store, "/alice/train", JobState.SUCCEEDED)
    assert (done.exit_code, done.error, done.backend_id) == (0, "", "default")
    assert world.peers["cw-h100"].count("deliver") == 1  # delivered once, not on every tick
    assert world.peers["cw-gb200"].count("deliver") == 0
    kinds = event_kinds(world.store, "/alice/train")
    assert kinds[:3] == ["admitted", "promoted", "handed_off"] and kinds[-1] == "reported"
    assert world.peer_backend("cw-h100").logs("/alice/train").lines == ("[replica 0] trained",)


def test_a_job_that_fails_on_its_peer_fails_here_with_its_exit_code(world: World) -> None:
    federation = world.federation()
    federation.submit(spec("/alice/crash", "echo oops; exit 9", h100=1), submitting_user=ALICE)
    failed = tick_until(federation, world.store, "/alice/crash", JobState.FAILED)
    assert failed.exit_code == 9
    assert failed.error == "Replica 0 exited with code 9"
    assert failed.peer_id == "cw-h100"


def test_a_job_nobody_can_host_is_rejected_at_once_and_nothing_is_written(world: World) -> None:
    federation = world.federation()
    submitted = federation.submit(spec("/alice/tpu", tpu=4), submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.REJECT
    assert submitted.job is None
    assert submitted.decision.reason.startswith("Job /alice/tpu is unschedulable")
    assert "Peer cw-h100 backend default: needs device-type" in submitted.decision.reason
    assert "Peer cw-gb200 backend default" in submitted.decision.reason
    assert world.store.get_job("/alice/tpu") is None
    assert world.store.events("/alice/tpu") == []


def test_a_pin_queues_for_that_peer_even_when_the_job_could_run_here(world: World) -> None:
    federation = world.federation()
    submitted = federation.submit(spec("/alice/eval", "echo evaluated", pin="cw-gb200"), submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.QUEUE
    assert submitted.decision.pinned_peer_id == "cw-gb200"
    assert submitted.job is not None and submitted.job.peer_id == "cw-gb200"
    assert submitted.job.pending_reason == "Queued for peer cw-gb200 to report free capacity"
    done = tick_until(federation, world.store, "/alice/eval", JobState.SUCCEEDED)
    assert done.peer_id == "cw-gb200"
    assert world.peers["cw-gb200"].count("deliver") == 1 and world.peers["cw-h100"].count("deliver") == 0


@pytest.mark.parametrize("submitter", ["", LOCAL_ADMIN])
def test_a_federated_job_without_an_accountable_submitter_is_refused_before_anything_is_written(
    lite: World, submitter: str
) -> None:
    federation = lite.federation()
    for job in (spec("/alice/gpu", h100=1), spec("/alice/pinned", pin="cw-gb200")):
        with pytest.raises(IdentityError, match=f"Job {job.job_id} would run on a peer cluster"):
            federation.submit(job, submitting_user=submitter)
        assert lite.store.get_job(job.job_id) is None
        assert lite.store.events(job.job_id) == []
    # A job that runs here needs no such submitter.
    local = federation.submit(spec("/alice/local"), submitting_user=submitter)
    assert local.decision.disposition is Disposition.LOCAL and local.job is not None


# Reattach and incarnations ----------------------------------------------------------------------


def test_resubmitting_a_live_job_reattaches_and_a_finished_one_runs_again(world: World) -> None:
    federation = world.federation()
    job = spec("/alice/again", world.held("again", before="echo run"), h100=1)
    first = federation.submit(job, submitting_user=ALICE)
    assert first.job is not None
    queued_again = federation.submit(job, submitting_user=ALICE)
    assert queued_again.reattached and queued_again.job is not None
    assert queued_again.job.nonce == first.job.nonce
    assert queued_again.decision.disposition is Disposition.QUEUE

    tick_until(federation, world.store, "/alice/again", JobState.RUNNING)
    running_again = federation.submit(job, submitting_user=ALICE)
    assert running_again.reattached and running_again.job is not None
    assert running_again.job.nonce == first.job.nonce and running_again.job.state is JobState.RUNNING
    world.release("again")
    tick_until(federation, world.store, "/alice/again", JobState.SUCCEEDED)

    second = federation.submit(job, submitting_user=ALICE)
    assert not second.reattached and second.job is not None
    assert second.job.nonce != first.job.nonce
    assert (second.job.state, second.job.handoff_state, second.job.exit_code, second.job.error) == (
        JobState.PENDING,
        HandoffState.QUEUED,
        None,
        "",
    )
    assert "resubmitted" in event_kinds(world.store, "/alice/again")
    done = tick_until(federation, world.store, "/alice/again", JobState.SUCCEEDED)
    assert done.nonce == second.job.nonce
    on_peer = world.peer_backend("cw-h100").status("/alice/again")
    assert on_peer is not None and on_peer.nonce == second.job.nonce  # the peer ran the new incarnation
    assert world.peers["cw-h100"].count("deliver") == 2


def test_a_local_job_resubmitted_after_it_finished_runs_again_locally(lite: World) -> None:
    federation = lite.federation()
    first = federation.submit(spec("/alice/local", "echo local"), submitting_user=ALICE)
    tick_until(federation, lite.store, "/alice/local", JobState.SUCCEEDED)
    second = federation.submit(spec("/alice/local", "echo local"), submitting_user=ALICE)
    assert first.job is not None and second.job is not None
    assert second.job.nonce != first.job.nonce and not second.reattached
    done = tick_until(federation, lite.store, "/alice/local", JobState.SUCCEEDED)
    assert done.nonce == second.job.nonce


# Delivery failures ------------------------------------------------------------------------------


def test_a_terminal_peer_answer_kills_the_job_with_the_peers_message(world: World) -> None:
    federation = world.federation()
    message = f"Submitter {ALICE} is not admitted for federation to this cluster"
    world.peers["cw-h100"].errors["deliver"] = PeerError(PeerErrorCode.PERMISSION_DENIED, message)
    federation.submit(spec("/alice/denied", h100=1), submitting_user=ALICE)
    report = federation.tick()
    assert report.rejected == ["/alice/denied"] and report.delivered == []
    job = world.job("/alice/denied")
    assert job.state is JobState.KILLED
    assert job.error == f"Peer cw-h100 rejected the handoff: {message}"
    assert job.handoff_state is HandoffState.REJECTED
    federation.tick()
    assert world.peers["cw-h100"].count("deliver") == 1  # never retried
    assert world.store.pending_handoffs(world.clock() + 10**9) == []


def test_a_peer_that_has_another_incarnation_running_rejects_the_handoff(world: World) -> None:
    federation = world.federation()
    other = spec("/alice/clash", world.held("clash"), h100=1)
    world.peer_backend("cw-h100").submit(Submission(other.job_id, "someone-else", other, "elsewhere", 1))
    federation.submit(other, submitting_user=ALICE)
    report = federation.tick()
    assert report.rejected == ["/alice/clash"]
    job = world.job("/alice/clash")
    assert job.state is JobState.KILLED
    assert job.error == (
        "Peer cw-h100 rejected the handoff: "
        "Job /alice/clash is still running here as another incarnation (nonce someone-else)"
    )
    world.release("clash")


@pytest.mark.parametrize("code", [PeerErrorCode.UNAVAILABLE, PeerErrorCode.UNAUTHENTICATED, PeerErrorCode.UNKNOWN])
def test_a_transient_delivery_failure_retries_with_exponential_backoff_and_jitter(
    lite: World, code: PeerErrorCode
) -> None:
    lite.jitter = Jitter(1.0, 1.0, 1.0, 0.0)
    federation = lite.federation()
    peer = lite.peers["cw-h100"]
    peer.errors["deliver"] = PeerError(code, "connection refused")
    federation.submit(spec("/alice/retry", h100=1), submitting_user=ALICE)

    delays = []
    for attempt in range(1, 5):
        start = lite.clock()
        report = federation.tick()
        assert report.retrying == ["/alice/retry"]
        job = lite.job("/alice/retry")
        assert (job.state, job.handoff_state) == (JobState.PENDING, HandoffState.PENDING)
        assert job.delivery_attempts == attempt and peer.count("deliver") == attempt
        assert job.last_delivery_error == f"{code.value}: connection refused"
        assert job.next_delivery_at_ms is not None
        delays.append(job.next_delivery_at_ms - start)
        # Not retried before its time ...
        lite.clock.advance(delays[-1] - 1)
        assert federation.tick().retrying == []
        assert peer.count("deliver") == attempt
        lite.clock.advance(1)  # ... and retried once it has come.
    base = DELIVERY_BACKOFF_BASE_MS
    assert delays == [base, 2 * base, 4 * base, 4 * base]  # doubling; the last draw (0) halves it

    del peer.errors["deliver"]
    report = federation.tick()
    assert report.delivered == ["/alice/retry"]
    job = lite.job("/alice/retry")
    assert job.handoff_state is HandoffState.HANDED_OFF and job.last_delivery_error == ""
    tick_until(federation, lite.store, "/alice/retry", JobState.SUCCEEDED)


def test_a_failing_or_hanging_peer_does_not_stop_delivery_to_the_others(
    tmp_path: Path, lite_with: Callable[..., World]
) -> None:
    world = lite_with(delivery_timeout_seconds=0.5, heartbeat_timeout_seconds=0.5)
    for name in ("cw-slow", "cw-broken"):
        backend = ProcessBackend("default", tmp_path / name, devices={"h100": 4})
        world.peers[name] = ScriptedPeer(AgentlessPeer(name, [backend]))
    world.peers["cw-slow"].hang("deliver")
    world.peers["cw-broken"].errors["deliver"] = RuntimeError("a bug in the peer client")
    federation = world.federation()
    for peer_id in ("cw-slow", "cw-broken", "cw-h100"):
        federation.submit(spec(f"/alice/to-{peer_id}", h100=1, pin=peer_id), submitting_user=ALICE)

    started = time.monotonic()
    report = federation.tick()
    assert time.monotonic() - started < 4  # bounded by the delivery timeout, not by the hang
    assert report.delivered == ["/alice/to-cw-h100"]
    assert sorted(report.retrying) == ["/alice/to-cw-broken", "/alice/to-cw-slow"]
    slow = world.job("/alice/to-cw-slow")
    assert slow.handoff_state is HandoffState.PENDING and slow.delivery_attempts == 1
    assert slow.last_delivery_error == "unavailable: peer cw-slow did not answer within 0.5 s"
    assert world.job("/alice/to-cw-broken").last_delivery_error == "a bug in the peer client"
    tick_until(federation, world.store, "/alice/to-cw-h100", JobState.SUCCEEDED)


def test_a_hanging_heartbeat_makes_only_that_peer_unreachable(lite_with: Callable[..., World]) -> None:
    world = lite_with(heartbeat_timeout_seconds=0.5)
    world.peers["cw-gb200"].hang("heartbeat")
    federation = world.federation()
    started = time.monotonic()
    report = federation.tick()
    assert time.monotonic() - started < 4
    assert report.heartbeats["cw-h100"] == "ok"
    assert report.heartbeats["cw-gb200"] == "unavailable: peer cw-gb200 did not answer within 0.5 s"
    reachable = {peer.peer_id: peer.reachable for peer in world.store.peers()}
    assert reachable == {"cw-h100": True, "cw-gb200": False}
    # Routing now sees only cw-h100: a gb200 job is rejected, an h100 job queued.
    gb200 = federation.submit(spec("/alice/gb200", gb200=1), submitting_user=ALICE)
    assert gb200.decision.disposition is Disposition.REJECT
    assert "Peer cw-gb200: unreachable." in gb200.decision.reason
    h100 = federation.submit(spec("/alice/h100", h100=1), submitting_user=ALICE)
    assert h100.decision.disposition is Disposition.QUEUE


# Cancel -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pin", ["", "cw-gb200"])
def test_cancelling_a_queued_job_ends_it_before_handoff_and_never_reaches_a_peer(world: World, pin: str) -> None:
    federation = world.federation()
    federation.submit(spec("/alice/never", "echo never", gb200=1, pin=pin), submitting_user=ALICE)
    outcome = federation.cancel("/alice/never")
    assert outcome.found and outcome.killed and outcome.notify_peer == ""
    job = world.job("/alice/never")
    assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
    assert job.handoff_state is HandoffState.QUEUED
    report = federation.tick()
    assert report.promoted == [] and report.delivered == []
    for peer in world.peers.values():
        assert peer.count("deliver") == 0
        assert peer.count("cancel") == 0  # there is nothing to cancel on any peer
    assert world.peer_backend("cw-gb200").status("/alice/never") is None
    again = federation.cancel("/alice/never")
    assert again.found and again.was_terminal and not again.killed


def test_cancelling_a_handed_off_job_reaches_the_peer_and_is_redriven_while_it_is_unreachable(world: World) -> None:
    federation = world.federation()
    federation.submit(spec("/alice/long", world.held("never-released"), h100=1), submitting_user=ALICE)
    tick_until(federation, world.store, "/alice/long", JobState.RUNNING)
    peer = world.peers["cw-h100"]
    peer.errors["cancel"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")

    outcome = federation.cancel("/alice/long")
    assert outcome.found and not outcome.killed and outcome.notify_peer == "cw-h100"
    assert peer.count("cancel") == 1
    job = world.job("/alice/long")
    assert job.state is JobState.RUNNING and job.cancel_requested
    assert [j.job_id for j in world.store.pending_cancels()] == ["/alice/long"]
    report = federation.tick()
    assert report.cancelled == [] and peer.count("cancel") == 2  # re-driven, still failing
    running = world.peer_backend("cw-h100").status("/alice/long")
    assert running is not None and running.state is JobState.RUNNING

    del peer.errors["cancel"]
    report = federation.tick()
    assert report.cancelled == ["/alice/long"]
    assert world.store.pending_cancels() == []
    killed = tick_until(federation, world.store, "/alice/long", JobState.KILLED)
    assert killed.error == "Cancelled on peer cw-h100"  # where the cancel was carried out
    on_peer = world.peer_backend("cw-h100").status("/alice/long")
    assert on_peer is not None and on_peer.state is JobState.KILLED
    federation.tick()
    assert peer.count("cancel") == 3  # confirmed: no more re-drives


def test_cancelling_a_local_job_stops_it_on_its_backend(lite: World) -> None:
    federation = lite.federation()
    federation.submit(spec("/alice/local-long", lite.held("never-released")), submitting_user=ALICE)
    tick_until(federation, lite.store, "/alice/local-long", JobState.RUNNING)
    outcome = federation.cancel("/alice/local-long")
    assert outcome.found and not outcome.killed and outcome.direction is Direction.LOCAL
    killed = tick_until(federation, lite.store, "/alice/local-long", JobState.KILLED)
    assert killed.error == "Cancelled"
    assert lite.store.pending_cancels() == []


def test_cancelling_a_job_whose_delivery_is_being_retried_ends_it_and_tells_the_peer(lite: World) -> None:
    federation = lite.federation()
    peer = lite.peers["cw-h100"]
    peer.errors["deliver"] = PeerError(PeerErrorCode.UNAVAILABLE, "timed out")
    federation.submit(spec("/alice/pending", h100=1), submitting_user=ALICE)
    assert federation.tick().retrying == ["/alice/pending"]
    assert lite.job("/alice/pending").handoff_state is HandoffState.PENDING
    outcome = federation.cancel("/alice/pending")
    # The delivery may have reached the peer before it failed: it is told, in case.
    assert outcome.killed and outcome.notify_peer == "cw-h100"
    assert peer.count("cancel") == 1
    job = lite.job("/alice/pending")
    assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
    del peer.errors["deliver"]
    lite.clock.advance(10 * DELIVERY_BACKOFF_BASE_MS)
    federation.tick()
    assert peer.count("deliver") == 1  # never delivered again
    assert lite.store.pending_cancels() == []


def fake_world(world: World) -> tuple[Federation, FakePeer]:
    fake = FakePeer("cw-fake", world.clock)
    return world.federation({"cw-fake": fake}), fake


def test_a_cancel_the_peer_answers_with_not_found_kills_the_job_as_gone(world: World) -> None:
    federation, fake = fake_world(world)
    federation.submit(spec("/alice/lost", h100=1), submitting_user=ALICE)
    assert federation.tick().delivered == ["/alice/lost"]
    assert world.job("/alice/lost").state is JobState.PENDING
    del fake.jobs["/alice/lost"]  # the peer lost it (pruned, or its state was wiped)
    federation.cancel("/alice/lost")
    job = world.job("/alice/lost")
    assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_PEER_GONE)
    assert fake.cancels == ["/alice/lost"]
    assert world.store.pending_cancels() == []


def test_a_job_the_peer_no_longer_has_fails_unless_a_cancel_was_asked_for(world: World) -> None:
    federation, fake = fake_world(world)
    for job_id in ("/alice/vanished", "/alice/cancelled-then-vanished"):
        federation.submit(spec(job_id, h100=1), submitting_user=ALICE)
    federation.tick()
    assert world.job("/alice/vanished").reported_at_ms is not None  # the peer reported it once
    # The cancel of the second cannot get through; then the peer forgets both.
    fake.cancel_error = PeerError(PeerErrorCode.UNAVAILABLE, "down")
    federation.cancel("/alice/cancelled-then-vanished")
    assert world.job("/alice/cancelled-then-vanished").state is JobState.PENDING
    fake.jobs.clear()
    report = federation.tick()
    assert sorted(report.reported) == ["/alice/cancelled-then-vanished", "/alice/vanished"]
    vanished = world.job("/alice/vanished")
    assert (vanished.state, vanished.error) == (JobState.FAILED, "Peer cw-fake no longer has the job")
    cancelled = world.job("/alice/cancelled-then-vanished")
    assert (cancelled.state, cancelled.error) == (JobState.KILLED, reasons.CANCELLED_PEER_GONE)


def test_a_local_job_its_submitter_is_still_starting_is_not_taken_for_gone(lite: World) -> None:
    federation = lite.federation()
    # As a worker between writing the job and handing it to its backend, while a tick runs.
    lite.store.admit(
        NewIncarnation(spec("/alice/starting"), direction=Direction.LOCAL, submitting_user=ALICE, backend_id="cpu"),
        now_ms=lite.clock(),
    )
    federation.tick()
    assert lite.job("/alice/starting").state is JobState.PENDING
    lite.clock.advance(60_000)  # its submitter never handed it over (it died): the job is gone
    report = federation.tick()
    assert report.reported == ["/alice/starting"]
    job = lite.job("/alice/starting")
    assert (job.state, job.error) == (JobState.FAILED, "The local backend no longer has the job")


def test_the_default_region_applies_to_jobs_that_name_none(tmp_path: Path, lite_with: Callable[..., World]) -> None:
    world = lite_with()
    world.config = world.config.model_copy(update={"default_region": "us-east"})
    federation = world.federation()
    # The peers advertise no region, so a job given the default region can only be rejected ...
    pinned_to_region = federation.submit(spec("/alice/regional", h100=1), submitting_user=ALICE)
    assert pinned_to_region.decision.disposition is Disposition.REJECT
    assert "region" in pinned_to_region.decision.reason
    # ... unless it asks for any region.
    anywhere = parse_job(
        {
            "job_id": "/alice/anywhere",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}},
            "regions": ["*"],
        }
    )
    assert federation.submit(anywhere, submitting_user=ALICE).decision.disposition is Disposition.QUEUE


# Expiry, probing, staleness ---------------------------------------------------------------------


def test_a_queued_job_past_its_deadline_becomes_unschedulable_and_is_never_delivered(world: World) -> None:
    federation = world.federation()
    federation.submit(spec("/alice/late", h100=1, deadline=world.clock() + 1_000), submitting_user=ALICE)
    federation.submit(spec("/alice/on-time", h100=1, deadline=world.clock() + 60_000), submitting_user=ALICE)
    world.clock.advance(1_001)
    report = federation.tick()
    assert report.expired == ["/alice/late"]
    assert report.promoted == ["/alice/on-time->cw-h100/default"]
    late = world.job("/alice/late")
    assert (late.state, late.error) == (JobState.UNSCHEDULABLE, reasons.SCHEDULING_TIMEOUT)
    assert late.handoff_state is HandoffState.QUEUED
    federation.tick()
    assert [argument for method, argument in world.peers["cw-h100"].calls if method == "deliver"] == ["/alice/on-time"]


def test_peers_never_heard_from_are_asked_at_submit_so_a_restart_does_not_reject_jobs(world: World) -> None:
    federation = world.federation()
    assert world.store.peers() == []  # as right after a restart: no heartbeat yet
    submitted = federation.submit(spec("/alice/early", h100=1), submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.QUEUE
    assert {peer_id: peer.count("heartbeat") for peer_id, peer in world.peers.items()} == {
        "cw-h100": 1,
        "cw-gb200": 1,
    }
    assert {peer.peer_id: peer.reachable for peer in world.store.peers()} == {"cw-h100": True, "cw-gb200": True}
    # Fresh peers are not asked again on the next submit.
    federation.submit(spec("/alice/early-2", h100=1), submitting_user=ALICE)
    assert world.peers["cw-h100"].count("heartbeat") == 1


def test_a_peer_that_cannot_be_reached_at_submit_is_reported_as_unreachable(lite: World) -> None:
    lite.peers["cw-h100"].errors["heartbeat"] = PeerError(PeerErrorCode.UNAVAILABLE, "no route to host")
    federation = lite.federation()
    submitted = federation.submit(spec("/alice/h100", h100=1), submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.REJECT
    assert "Peer cw-h100: unreachable." in submitted.decision.reason
    record = {peer.peer_id: peer for peer in lite.store.peers()}["cw-h100"]
    assert not record.reachable and record.last_error == "unavailable: no route to host"


def test_a_stale_heartbeat_makes_the_peer_unreachable_for_routing(lite: World) -> None:
    federation = lite.federation()
    federation.tick()
    assert federation.staleness_ms == 120_000
    job = spec("/alice/stale", h100=1)

    def decision() -> Disposition:
        return route(
            job,
            local_backends=federation.local_backends(),
            peers=federation.peer_states(),
            now_ms=lite.clock(),
            staleness_ms=federation.staleness_ms,
        ).disposition

    lite.clock.advance(120_000)
    assert decision() is Disposition.QUEUE  # at the bound: still fresh
    lite.clock.advance(1)
    assert decision() is Disposition.REJECT
    states = {peer.peer_id: peer for peer in federation.peer_states()}
    assert states["cw-h100"].reachable  # its last heartbeat succeeded, but it is too old to trust
    assert not states["cw-h100"].is_reachable(lite.clock(), federation.staleness_ms)
    reason = route(
        job,
        local_backends=federation.local_backends(),
        peers=federation.peer_states(),
        now_ms=lite.clock(),
        staleness_ms=federation.staleness_ms,
    ).reason
    assert "Peer cw-h100: last heartbeat 120s ago, past the 120s bound." in reason

    # At submit a stale peer is asked again, and answers: the job queues.
    before = lite.peers["cw-h100"].count("heartbeat")
    assert federation.submit(job, submitting_user=ALICE).decision.disposition is Disposition.QUEUE
    assert lite.peers["cw-h100"].count("heartbeat") == before + 1


def test_a_dead_peer_is_asked_at_submit_only_when_it_matters_and_not_on_every_submit(lite: World) -> None:
    lite.peers["cw-h100"].errors["heartbeat"] = PeerError(PeerErrorCode.UNAVAILABLE, "no route to host")
    federation = lite.federation()
    federation.tick()
    asked = lite.peers["cw-h100"].count("heartbeat")
    lite.clock.advance(STALE_PROBE_COOLDOWN_MS)
    # A job that runs here never waits for a peer.
    assert federation.submit(spec("/alice/cpu"), submitting_user=ALICE).decision.disposition is Disposition.LOCAL
    assert lite.peers["cw-h100"].count("heartbeat") == asked
    # One it would reject asks the dead peer once; the next within the cooldown does not ask again.
    for name in ("/alice/h100-a", "/alice/h100-b"):
        decision = federation.submit(spec(name, h100=1), submitting_user=ALICE).decision
        assert decision.disposition is Disposition.REJECT and "Peer cw-h100: unreachable." in decision.reason
    assert lite.peers["cw-h100"].count("heartbeat") == asked + 1
    lite.clock.advance(STALE_PROBE_COOLDOWN_MS)
    federation.submit(spec("/alice/h100-c", h100=1), submitting_user=ALICE)
    assert lite.peers["cw-h100"].count("heartbeat") == asked + 2


def test_a_cancel_that_lands_while_a_local_job_is_being_started_stops_it(lite: World) -> None:
    federation = lite.federation()
    job = spec("/alice/raced", lite.held("never-released"))
    # The submit's own steps, with a cancel in between: admitted, cancelled, then handed to the backend.
    admission = lite.store.admit(
        NewIncarnation(job, direction=Direction.LOCAL, submitting_user=ALICE, backend_id="cpu"), now_ms=lite.clock()
    )
    federation.cancel("/alice/raced")
    federation.submitter.start_local(admission.job, job)
    backend = lite.backends["cpu"]
    deadline = time.monotonic() + 30
    while (report := backend.status("/alice/raced")) is None or not report.state.terminal:
        assert time.monotonic() < deadline, report
        time.sleep(0.1)
    assert report.state is JobState.KILLED
    killed = tick_until(federation, lite.store, "/alice/raced", JobState.KILLED)
    assert killed.error == "Cancelled"


def test_jobs_whose_submitting_task_failed_are_cancelled_and_the_others_left_alone(lite: World) -> None:
    from iris_airflow_provider.store.records import Origin

    federation = lite.federation()
    states = {"failed": "failed", "retrying": "up_for_retry", "done": "success", "cleared": None}
    for name in states:
        # Pinned to a full peer: every one of them stays queued until something cancels it.
        federation.submit(
            spec(f"/alice/{name}", h100=64, pin="cw-h100"),
            submitting_user=ALICE,
            origin=Origin("train", "run-1", name, -1),
        )
    asked: list[tuple[str, list[str], list[str]]] = []

    def task_states(dag_id: str, run_ids: list[str], task_ids: list[str]) -> dict[str, dict[str, Any]]:
        asked.append((dag_id, run_ids, task_ids))
        return {"run-1": dict(states)}

    report = federation.tick(task_states=task_states)
    assert asked == [("train", ["run-1"], sorted(states))]
    assert report.cancelled == ["/alice/failed"]
    failed = lite.job("/alice/failed")
    assert (failed.state, failed.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
    for name in ("retrying", "done", "cleared"):
        assert lite.job(f"/alice/{name}").state is JobState.PENDING

"""Bug 1 of issue 12: a cancel racing a delivery. While a delivery is in flight the peer answers a
cancel with "not found" (the job has not arrived); that answer settles nothing. The cancel is
re-driven until the peer confirms it killed the incarnation that was delivered, or that it never
had it once the delivery settled; the final message says where the cancel took effect. Each race
is staged with a gated peer (the delivery is held inside the peer until the test lets it go)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.cancel_settlement import DELIVERY_CLAIM_MARGIN_MS
from iris_airflow_provider.core.handoff_policy import DELIVERY_BACKOFF_BASE_MS, DELIVERY_BACKOFF_MAX_MS
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.tick import TickReport
from tests.services.world import ALICE, World, event_kinds, spec, tick_until
from tests.waiting import wait_for, wait_state

RESET = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")


class TickInThread:
    """A tick run in another thread, so the test can act while its delivery is held in the peer."""

    def __init__(self, federation: Federation) -> None:
        self.reports: list[TickReport] = []
        self.thread = threading.Thread(target=lambda: self.reports.append(federation.tick()))
        self.thread.start()

    def join(self) -> TickReport:
        self.thread.join(30)
        [report] = self.reports
        return report


def cancel_while_delivering(world: World, job_id: str) -> tuple[threading.Event, TickInThread]:
    """Start a tick whose delivery of ``job_id`` is held in cw-h100, and cancel the job meanwhile."""
    peer = world.peers["cw-h100"]
    gate = peer.hang("deliver")
    federation = world.federation()
    tick = TickInThread(federation)
    wait_for(lambda: peer.count("deliver") == 1, "the delivery to be in flight")
    outcome = federation.cancel(job_id)
    # The peer does not have it yet, and says so: no answer while the delivery may still land.
    assert outcome.found and not outcome.killed and outcome.notify_peer == "cw-h100"
    assert peer.count("cancel") == 1
    job = world.job(job_id)
    assert not job.terminal and job.cancel_requested and job.handoff_state is HandoffState.PENDING
    return gate, tick


def test_a_cancel_racing_a_delivery_reaches_the_incarnation_that_landed(world_with: Callable[..., World]) -> None:
    world = world_with(delivery_timeout_seconds=30)
    federation = world.federation()
    federation.submit(spec("/alice/raced", world.held("raced"), h100=1), submitting_user=ALICE)
    gate, tick = cancel_while_delivering(world, "/alice/raced")
    gate.set()  # the delivery lands after the peer said it did not have the job
    report = tick.join()
    assert report.delivered == ["/alice/raced"]
    # Handed off with the cancel re-armed, and the same tick's re-drive got it to the peer, which has it now.
    assert report.cancelled == ["/alice/raced"]
    handed = world.job("/alice/raced")
    assert handed.handoff_state is HandoffState.HANDED_OFF and world.store.pending_cancels() == []
    wait_state(world.peer_backend("cw-h100"), "/alice/raced", JobState.KILLED, timeout=15)
    killed = tick_until(federation, world.store, "/alice/raced", JobState.KILLED)
    assert killed.error == "Cancelled on peer cw-h100"  # not "Cancelled before handoff": it was handed off
    lines = [line for _, line in world.store.log_lines("/alice/raced")]
    assert (
        "[iris-federation] Peer cw-h100 admitted the job while a cancel was requested: the cancel is "
        "routed to the peer" in lines
    )
    assert world.peers["cw-h100"].count("deliver") == 1


def test_a_delivery_whose_answer_is_lost_after_the_cancel_is_killed_there(lite_with: Callable[..., World]) -> None:
    world = lite_with(delivery_timeout_seconds=30)
    world.peers["cw-h100"].lost_answers["deliver"] = RESET  # admitted there; its answer never arrives
    federation = world.federation()
    federation.submit(spec("/alice/unheard", world.held("unheard"), h100=1), submitting_user=ALICE)
    gate, tick = cancel_while_delivering(world, "/alice/unheard")
    gate.set()
    report = tick.join()
    assert report.retrying == ["/alice/unheard"] and report.cancelled == ["/alice/unheard"]
    wait_state(world.peer_backend("cw-h100"), "/alice/unheard", JobState.KILLED, timeout=15)
    killed = tick_until(federation, world.store, "/alice/unheard", JobState.KILLED)
    assert (killed.error, killed.handoff_state) == ("Cancelled on peer cw-h100", HandoffState.HANDED_OFF)
    world.clock.advance(DELIVERY_BACKOFF_MAX_MS)
    federation.tick()
    assert world.peers["cw-h100"].count("deliver") == 1  # a cancelled job is never delivered again


def test_a_delivery_the_peer_never_took_ends_the_cancelled_job_before_handoff(lite_with: Callable[..., World]) -> None:
    world = lite_with(delivery_timeout_seconds=30)
    world.peers["cw-h100"].errors["deliver"] = RESET  # refused before it reached the peer's backend
    federation = world.federation()
    federation.submit(spec("/alice/refused", "echo never", h100=1), submitting_user=ALICE)
    gate, tick = cancel_while_delivering(world, "/alice/refused")
    gate.set()
    report = tick.join()
    # Settled: the peer's "not found" now means it never had the job.
    assert report.cancelled == ["/alice/refused"]
    job = world.job("/alice/refused")
    assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
    assert world.store.pending_cancels() == [] and world.peer_backend("cw-h100").status("/alice/refused") is None


def test_a_delivery_the_tick_stopped_waiting_for_is_recorded_when_it_lands(lite_with: Callable[..., World]) -> None:
    world = lite_with(delivery_timeout_seconds=0.5)
    peer = world.peers["cw-h100"]
    gate = peer.hang("deliver")
    federation = world.federation()
    federation.submit(spec("/alice/late", world.held("late"), h100=1), submitting_user=ALICE)
    assert federation.tick().retrying == ["/alice/late"]  # the tick gave up; the call is still in the peer
    outcome = federation.cancel("/alice/late")
    assert not outcome.killed and not world.job("/alice/late").terminal  # it may yet land
    gate.set()
    wait_for(lambda: world.job("/alice/late").handoff_state is HandoffState.HANDED_OFF, "the late delivery")
    assert federation.tick().cancelled == ["/alice/late"]
    wait_state(world.peer_backend("cw-h100"), "/alice/late", JobState.KILLED, timeout=15)
    assert tick_until(federation, world.store, "/alice/late", JobState.KILLED).error == "Cancelled on peer cw-h100"


def test_a_delivery_claim_left_by_a_killed_tick_holds_until_it_is_stale(lite_with: Callable[..., World]) -> None:
    world = lite_with(delivery_timeout_seconds=30)
    peer = world.peers["cw-h100"]
    peer.errors["deliver"] = RESET
    federation = world.federation()
    federation.submit(spec("/alice/claimed", h100=1), submitting_user=ALICE)
    federation.submit(spec("/alice/cancelled", h100=1), submitting_user=ALICE)
    assert sorted(federation.tick().retrying) == ["/alice/cancelled", "/alice/claimed"]
    del peer.errors["deliver"]
    # Another tick claimed both deliveries, and died in its calls (the claims stay behind).
    for job_id in ("/alice/claimed", "/alice/cancelled"):
        assert world.store.begin_delivery(job_id, world.job(job_id).nonce, world.clock(), stale_before_ms=0)
    outcome = federation.cancel("/alice/cancelled")
    assert not outcome.killed  # its delivery may still land
    world.clock.advance(2 * DELIVERY_BACKOFF_BASE_MS)  # past the first retry's backoff, not past the claims
    report = federation.tick()
    assert report.delivered == [] and report.cancelled == [] and peer.count("deliver") == 2
    world.clock.advance(30_000 + DELIVERY_CLAIM_MARGIN_MS - 2 * DELIVERY_BACKOFF_BASE_MS)
    report = federation.tick()  # the dead tick's calls have timed out, whatever became of them
    assert report.delivered == ["/alice/claimed"] and report.cancelled == ["/alice/cancelled"]
    cancelled = world.job("/alice/cancelled")
    assert (cancelled.state, cancelled.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)


def test_a_cancel_before_any_delivery_never_reaches_a_peer(lite: World) -> None:
    federation = lite.federation()
    job = federation.submit(spec("/alice/promoted", h100=1), submitting_user=ALICE).job
    assert job is not None
    [promotion] = federation.placement.place().promoted  # promoted; the tick's delivery has not run
    assert promotion.startswith("/alice/promoted->cw-h100")
    outcome = federation.cancel("/alice/promoted")
    assert outcome.killed and outcome.notify_peer == ""
    assert lite.job("/alice/promoted").error == reasons.CANCELLED_BEFORE_HANDOFF
    federation.tick()
    assert lite.peers["cw-h100"].count("deliver") == 0 and lite.peers["cw-h100"].count("cancel") == 0
    assert "handed_off" not in event_kinds(lite.store, "/alice/promoted")

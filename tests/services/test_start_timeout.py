"""Start timeout (issue 12): a job a live peer accepted but has not started within
``placement.start_timeout_seconds`` (or the job's own ``start_timeout_seconds``; 0 turns it off) was
placed on capacity that was not really there. Unless pinned, it is withdrawn: terminated there by
its nonce and, only once the peer confirms, back to the queue under a new nonce, avoiding that
peer. The withdrawal survives a failing peer and a restart; a cancel during it wins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.services.federation import Federation
from tests.services.world import ALICE, FakePeer, ScriptedPeer, World, event_kinds, spec, tick_until

TIMEOUT_S = 60
RESET = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")


def slow_world(world: World) -> tuple[Callable[[], Federation], FakePeer]:
    """cw-fake (4 h100, first in order: it takes ties) admits jobs and never starts them; cw-h100 runs them."""
    fake = FakePeer("cw-fake", world.clock, h100=4)
    peers: dict[str, Any] = {"cw-fake": ScriptedPeer(fake), "cw-h100": world.peers["cw-h100"]}  # type: ignore[arg-type]
    return lambda: world.federation(peers), fake


def test_a_job_a_peer_does_not_start_in_time_is_withdrawn_and_runs_elsewhere(world_with: Callable[..., World]) -> None:
    world = world_with(start_timeout_seconds=TIMEOUT_S)
    make, fake = slow_world(world)
    federation = make()
    federation.submit(spec("/alice/slow", "echo ran", h100=1), submitting_user=ALICE)
    assert federation.tick().delivered == ["/alice/slow"]
    first = world.job("/alice/slow")
    assert (first.peer_id, first.handoff_state, first.state) == ("cw-fake", HandoffState.HANDED_OFF, JobState.PENDING)

    world.clock.advance(TIMEOUT_S * 1000 - 1)
    assert federation.tick().withdrawn == []
    world.clock.advance(1)
    report = federation.tick()
    assert report.withdrawn == ["/alice/slow"]
    assert fake.terminations == ["/alice/slow"] and fake.jobs["/alice/slow"].state is JobState.KILLED
    moved = world.job("/alice/slow")
    assert (moved.handoff_state, moved.requeue_count) == (HandoffState.QUEUED, 1) and moved.nonce != first.nonce
    assert moved.avoided_peer_ids(world.clock()) == ["cw-fake"]
    assert world.store.abandoned_handoffs() == []  # confirmed over there: nothing to terminate later
    done = tick_until(federation, world.store, "/alice/slow", JobState.SUCCEEDED)
    assert done.peer_id == "cw-h100"
    kinds = event_kinds(world.store, "/alice/slow")
    assert kinds.index("withdrawing") < kinds.index("requeued")
    said = [line for _, line in world.store.log_lines("/alice/slow") if line.startswith("[iris-federation]")]
    why = reasons.not_started("cw-fake", TIMEOUT_S * 1000)
    assert (
        said[0] == f"[iris-federation] Withdrawing the job: {why}; it is terminated there, then goes back to the queue"
    )
    assert said[1].startswith("[iris-federation] Back in the queue: withdrawn from peer cw-fake, which confirmed it")


def test_a_withdrawal_waits_for_the_peer_to_confirm_and_survives_a_restart(lite_with: Callable[..., World]) -> None:
    world = lite_with(start_timeout_seconds=TIMEOUT_S)
    make, fake = slow_world(world)
    federation = make()
    federation.submit(spec("/alice/held", h100=1), submitting_user=ALICE)
    federation.tick()
    fake.cancel_error = RESET  # it cannot be told to stop the job
    world.clock.advance(TIMEOUT_S * 1000)
    assert federation.tick().withdrawn == []
    held = world.job("/alice/held")
    assert held.withdraw_reason and held.peer_id == "cw-fake" and held.handoff_state is HandoffState.HANDED_OFF
    assert held.state is JobState.PENDING  # still there: nothing moves before the peer confirms

    # Meanwhile the job is killed there (the first terminate got through; its answer was lost) and a
    # new tick process starts: the kill it syncs is the withdrawal's own doing, not the job's end.
    fake.cancel_error = None
    fake.terminate("/alice/held", held.nonce)
    restarted = make()
    report = restarted.tick()
    assert report.withdrawn == ["/alice/held"]
    moved = world.job("/alice/held")
    assert moved.handoff_state is not HandoffState.HANDED_OFF and moved.state is not JobState.KILLED
    assert moved.nonce != held.nonce


def test_pinned_started_and_untimed_jobs_are_never_withdrawn(lite_with: Callable[..., World]) -> None:
    world = lite_with(start_timeout_seconds=TIMEOUT_S)
    make, _ = slow_world(world)
    federation = make()
    federation.submit(spec("/alice/pinned", h100=1, pin="cw-fake"), submitting_user=ALICE)
    federation.submit(spec("/alice/patient", h100=1, start_timeout_seconds=0), submitting_user=ALICE)
    federation.submit(spec("/alice/running", world.held("running"), h100=1, pin="cw-h100"), submitting_user=ALICE)
    tick_until(federation, world.store, "/alice/running", JobState.RUNNING)
    assert world.job("/alice/patient").peer_id == "cw-fake"
    world.clock.advance(TIMEOUT_S * 1000 * 10)
    assert federation.tick().withdrawn == []
    for job_id in ("/alice/pinned", "/alice/patient", "/alice/running"):
        assert world.job(job_id).handoff_state is HandoffState.HANDED_OFF and not world.job(job_id).withdraw_reason
    world.release("running")


def test_a_job_may_set_a_shorter_start_timeout_than_the_clusters(lite: World) -> None:
    make, _ = slow_world(lite)  # the cluster default: 1800 s
    federation = make()
    federation.submit(spec("/alice/eager", h100=1, start_timeout_seconds=10), submitting_user=ALICE)
    federation.tick()
    lite.clock.advance(10_000)
    assert federation.tick().withdrawn == ["/alice/eager"]


def test_a_cancel_during_a_withdrawal_wins(lite_with: Callable[..., World]) -> None:
    world = lite_with(start_timeout_seconds=TIMEOUT_S)
    make, fake = slow_world(world)
    federation = make()
    federation.submit(spec("/alice/changed-mind", h100=1), submitting_user=ALICE)
    federation.tick()
    fake.cancel_error = RESET
    world.clock.advance(TIMEOUT_S * 1000)
    federation.tick()
    assert world.job("/alice/changed-mind").withdraw_reason
    assert not federation.cancel("/alice/changed-mind").killed
    assert world.job("/alice/changed-mind").withdraw_reason == ""  # the cancel supersedes it
    fake.cancel_error = None
    report = federation.tick()
    assert report.withdrawn == [] and report.cancelled == ["/alice/changed-mind"]
    killed = tick_until(federation, world.store, "/alice/changed-mind", JobState.KILLED)
    assert killed.error == "Cancelled on peer cw-fake" and killed.requeue_count == 0


def test_an_unreachable_peers_jobs_are_left_to_the_lost_peer_rule(lite_with: Callable[..., World]) -> None:
    world = lite_with(start_timeout_seconds=TIMEOUT_S, peer_lost_seconds=TIMEOUT_S * 10)
    fake = FakePeer("cw-fake", world.clock, h100=4)
    scripted = ScriptedPeer(fake)  # type: ignore[arg-type]
    federation = world.federation({"cw-fake": scripted})
    federation.submit(spec("/alice/cut-off", h100=1), submitting_user=ALICE)
    federation.tick()
    scripted.go_down()
    world.clock.advance(TIMEOUT_S * 1000 * 5)  # past its start timeout and the heartbeat staleness
    assert federation.tick().withdrawn == []
    assert world.job("/alice/cut-off").withdraw_reason == ""

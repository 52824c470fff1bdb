"""Requeue (DESIGN.md, beyond the reference): an unpinned job a peer cannot take goes back to the
queue and avoids that peer for a while, within a budget; whatever it may have left on that peer is
terminated there by job id and nonce; pinned and accepted jobs never move."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.grace import ABANDONED_UNCONFIGURED_TTL_MS
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode
from iris_airflow_provider.services.job_views import job_explanation
from iris_airflow_provider.store.records import pending_reason_history
from tests.services.world import ALICE, World, event_kinds, spec, tick_until
from tests.waiting import wait_state

REQUEUE_AFTER_S = 60


AVOID_S = 600
TOO_SMALL = PeerError(PeerErrorCode.RESOURCE_EXHAUSTED, "no backend of cluster x is large enough")


def test_a_job_a_peer_keeps_failing_to_take_is_requeued_to_another_and_runs_there(
    world_with: Callable[..., World],
) -> None:
    world = world_with(requeue_after_seconds=REQUEUE_AFTER_S, requeue_avoid_seconds=AVOID_S)
    world.add_peer("cw-spare", h100=4)
    world.peers["cw-h100"].errors["deliver"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection refused")
    federation = world.federation()
    federation.submit(spec("/alice/moved", "echo moved", h100=1), submitting_user=ALICE)

    first = federation.tick()  # equal fits: the lower peer id wins, and fails
    assert first.promoted == ["/alice/moved->cw-h100/default"] and first.retrying == ["/alice/moved"]
    world.clock.advance(REQUEUE_AFTER_S * 1000 - 1)
    assert federation.tick().requeued == []  # retried, not yet given up on
    world.clock.advance(30_000)

    report = federation.tick()
    assert report.requeued == ["/alice/moved"]
    job = world.job("/alice/moved")
    assert (job.handoff_state, job.peer_id, job.requeue_count) == (HandoffState.QUEUED, "", 1)
    assert job.pending_reason == reasons.QUEUED_UNPINNED
    assert job.avoided_peer_ids(world.clock()) == ["cw-h100"]
    assert job.avoided_peer_ids(world.clock() + AVOID_S * 1000) == []  # not forever
    # cw-h100 never admitted it: asked to drop it all the same, it has nothing to stop.
    assert world.peers["cw-h100"].count("terminate") == 1 and world.store.abandoned_handoffs() == []
    explained = job_explanation(federation, job, world.clock())
    statuses = {row["peer_id"]: row["status"] for row in explained["explanation"]["peers"]}
    assert statuses["cw-h100"].startswith("avoided") and statuses["cw-spare"] == "ok"
    assert explained["status"] == "placeable" and "cw-spare/default" in explained["summary"]

    report = federation.tick()
    assert report.promoted == ["/alice/moved->cw-spare/default"] and report.delivered == ["/alice/moved"]
    done = tick_until(federation, world.store, "/alice/moved", JobState.SUCCEEDED)
    assert done.peer_id == "cw-spare" and done.nonce == job.nonce
    assert "requeued" in event_kinds(world.store, "/alice/moved")
    assert "stray_terminated" not in event_kinds(world.store, "/alice/moved")
    history = pending_reason_history(Direction.SENT, world.store.events("/alice/moved"))
    assert history[:4] == [
        reasons.QUEUED_UNPINNED,
        reasons.awaiting_acceptance("cw-h100"),
        reasons.QUEUED_UNPINNED,  # not "Queued for peer cw-h100": it left that peer
        reasons.awaiting_acceptance("cw-spare"),
    ]
    assert all("cw-spare" in reason for reason in history[4:])  # then whatever it reported before it ran


def test_an_incarnation_admitted_behind_a_lost_answer_is_terminated_on_that_peer(
    lite_with: Callable[..., World],
) -> None:
    world = lite_with(requeue_after_seconds=REQUEUE_AFTER_S)
    world.add_peer("cw-spare", h100=4)
    # Its answers to deliveries are lost, and so are its status reports (a report of the job would
    # tell us it has it, and then it stays there).
    world.peers["cw-h100"].lost_answers["deliver"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")
    world.peers["cw-h100"].errors["sync"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")
    federation = world.federation()
    federation.submit(spec("/alice/twice", world.held("twice"), h100=1), submitting_user=ALICE)
    federation.tick()
    stray = world.peer_backend("cw-h100").status("/alice/twice")
    assert stray is not None and not stray.state.terminal  # admitted there; we never heard

    world.clock.advance(REQUEUE_AFTER_S * 1000 + 30_000)
    report = federation.tick()
    assert report.requeued == ["/alice/twice"]  # and cw-h100 is told to stop what it holds
    wait_state(world.peer_backend("cw-h100"), "/alice/twice", JobState.KILLED, timeout=15)  # stopped there
    # Remembered until the peer says it is over there, not merely told: then forgotten, and said so.
    report = federation.tick()
    assert "/alice/twice" in report.cancelled and report.delivered == ["/alice/twice"]
    assert "stray_terminated" in event_kinds(world.store, "/alice/twice")
    assert world.store.abandoned_handoffs() == []
    world.release("twice")
    done = tick_until(federation, world.store, "/alice/twice", JobState.SUCCEEDED)
    assert done.peer_id == "cw-spare"


def test_a_peer_too_small_for_the_job_sends_it_back_at_once(lite: World) -> None:
    lite.add_peer("cw-spare", h100=4)
    lite.peers["cw-h100"].errors["deliver"] = TOO_SMALL
    federation = lite.federation()
    federation.submit(spec("/alice/big", h100=1), submitting_user=ALICE)
    assert federation.tick().requeued == ["/alice/big"]  # no waiting for requeue_after_seconds
    assert lite.job("/alice/big").last_delivery_error == f"resource_exhausted: {TOO_SMALL.message}"
    assert federation.tick().delivered == ["/alice/big"]
    assert lite.job("/alice/big").peer_id == "cw-spare"


def test_a_job_no_peer_can_take_fails_once_its_requeue_budget_is_spent(lite_with: Callable[..., World]) -> None:
    world = lite_with(max_requeues=1)
    world.add_peer("cw-spare", h100=4)
    for peer_id in ("cw-h100", "cw-spare"):
        world.peers[peer_id].errors["deliver"] = TOO_SMALL
    federation = world.federation()
    federation.submit(spec("/alice/nowhere", h100=1), submitting_user=ALICE)
    assert federation.tick().requeued == ["/alice/nowhere"]
    report = federation.tick()
    assert report.requeued == [] and report.rejected == ["/alice/nowhere"]
    job = world.job("/alice/nowhere")
    assert (job.state, job.handoff_state) == (JobState.FAILED, HandoffState.REJECTED)
    assert job.error == (
        f"No federation peer could take the job after 1 requeue(s); peer cw-spare: resource_exhausted: "
        f"{TOO_SMALL.message}"
    )
    assert world.peers["cw-h100"].count("deliver") == world.peers["cw-spare"].count("deliver") == 1


def test_a_job_whose_peer_left_the_configuration_is_requeued(lite: World) -> None:
    lite.add_peer("cw-spare", h100=4)
    lite.peers["cw-h100"].errors["deliver"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection refused")
    lite.federation().submit(spec("/alice/orphan", h100=1), submitting_user=ALICE)
    assert lite.federation().tick().retrying == ["/alice/orphan"]

    without = lite.federation(peers={p: peer for p, peer in lite.peers.items() if p != "cw-h100"})
    report = without.tick()  # a peer removed from the cluster file is lost at once: no waiting
    assert report.requeued == ["/alice/orphan"] and report.delivered == ["/alice/orphan"]
    assert lite.job("/alice/orphan").peer_id == "cw-spare"
    assert "requeue 1 of 3: " + reasons.peer_removed("cw-h100") in [
        e.detail for e in lite.store.events("/alice/orphan")
    ]
    # It cannot be asked to drop what it may hold; that waits until it is configured again, a week at most.
    assert [(h.peer_id, h.job_id) for h in lite.store.abandoned_handoffs()] == [("cw-h100", "/alice/orphan")]
    lite.clock.advance(ABANDONED_UNCONFIGURED_TTL_MS)
    without.tick()
    assert len(lite.store.abandoned_handoffs()) == 1
    lite.clock.advance(1)
    without.tick()
    assert lite.store.abandoned_handoffs() == []


def test_a_pinned_job_keeps_retrying_its_pin_and_is_never_requeued(lite_with: Callable[..., World]) -> None:
    world = lite_with(requeue_after_seconds=REQUEUE_AFTER_S)
    world.add_peer("cw-spare", h100=4)
    world.peers["cw-h100"].errors["deliver"] = TOO_SMALL
    federation = world.federation()
    federation.submit(spec("/alice/pinned", h100=1, pin="cw-h100"), submitting_user=ALICE)
    for _ in range(3):
        report = federation.tick()
        assert report.requeued == [] and report.retrying == ["/alice/pinned"]
        world.clock.advance(REQUEUE_AFTER_S * 1000 * 2)  # past the delivery backoff every time
    assert world.peers["cw-h100"].count("deliver") == 3
    job = world.job("/alice/pinned")
    assert (job.handoff_state, job.peer_id, job.requeue_count) == (HandoffState.PENDING, "cw-h100", 0)
    assert world.peers["cw-spare"].count("deliver") == 0


def test_a_job_the_peer_accepted_is_never_moved(lite_with: Callable[..., World]) -> None:
    world = lite_with(requeue_after_seconds=REQUEUE_AFTER_S)
    world.add_peer("cw-spare", h100=4)
    federation = world.federation()
    federation.submit(spec("/alice/kept", world.held("kept"), h100=1), submitting_user=ALICE)
    assert federation.tick().delivered == ["/alice/kept"]
    world.peers["cw-h100"].errors["sync"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection refused")
    world.clock.advance(REQUEUE_AFTER_S * 1000 * 10)
    assert federation.tick().requeued == []
    assert world.job("/alice/kept").handoff_state is HandoffState.HANDED_OFF
    world.release("kept")


def test_an_agentless_peer_too_small_for_the_job_answers_resource_exhausted(lite: World) -> None:
    big = spec("/alice/big", h100=8)  # cw-h100 has 4
    handoff = Handoff(big.job_id, "n1", big, "default", "marin", ALICE, ALICE, 1)
    with pytest.raises(PeerError) as caught:
        lite.real_peers["cw-h100"].deliver(handoff)
    assert caught.value.code is PeerErrorCode.RESOURCE_EXHAUSTED and caught.value.requeues
    assert "cannot ever host 1 x 8 h100" in caught.value.message
    assert lite.peer_backend("cw-h100").status("/alice/big") is None


def test_back_on_the_peer_it_left_the_job_runs_there_instead_of_replaying_what_was_stopped(
    lite_with: Callable[..., World],
) -> None:
    world = lite_with(requeue_after_seconds=REQUEUE_AFTER_S, requeue_avoid_seconds=AVOID_S)
    peer = world.peers["cw-h100"]
    peer.lost_answers["deliver"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")
    peer.errors["sync"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")
    federation = world.federation()
    federation.submit(spec("/alice/again", "echo ran", h100=1), submitting_user=ALICE)
    federation.tick()  # admitted on cw-h100 behind a lost answer
    world.clock.advance(REQUEUE_AFTER_S * 1000 + 30_000)
    assert federation.tick().requeued == ["/alice/again"]  # and what it left there is told to stop
    ended = (JobState.KILLED, JobState.SUCCEEDED)  # stopped there, unless it finished first
    wait_state(world.peer_backend("cw-h100"), "/alice/again", *ended, timeout=15)

    del peer.lost_answers["deliver"], peer.errors["sync"]
    assert federation.tick().promoted == []  # cw-h100, the only h100 peer, is avoided for now
    assert world.store.abandoned_handoffs() == []  # it said that incarnation is over there
    world.clock.advance(AVOID_S * 1000)
    assert federation.tick().delivered == ["/alice/again"]
    done = tick_until(federation, world.store, "/alice/again", JobState.SUCCEEDED)
    assert (done.peer_id, done.exit_code) == ("cw-h100", 0)


def test_a_peer_still_to_be_told_to_drop_a_job_is_avoided_until_it_has(lite: World) -> None:
    lite.add_peer("cw-spare", h100=4)
    lite.peers["cw-h100"].errors["deliver"] = TOO_SMALL
    lite.peers["cw-h100"].errors["terminate"] = PeerError(PeerErrorCode.UNAVAILABLE, "connection refused")
    federation = lite.federation()
    job = federation.submit(spec("/alice/left", h100=1), submitting_user=ALICE).job
    assert job is not None
    assert federation.tick().requeued == ["/alice/left"]
    requeued = lite.job("/alice/left")
    [candidate] = federation.candidates([requeued], lite.clock() + AVOID_S * 1000 * 10)  # avoidance long over
    assert candidate.avoided_peer_ids == frozenset({"cw-h100"})  # its old incarnation is still to be stopped
    del lite.peers["cw-h100"].errors["terminate"]
    federation.tick()
    [candidate] = federation.candidates([requeued], lite.clock() + AVOID_S * 1000 * 10)
    assert candidate.avoided_peer_ids == frozenset()

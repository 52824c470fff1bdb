"""Lost peers (issue 12): once a peer has been unreachable for ``placement.peer_lost_seconds`` (or is
removed from the cluster file: at once), each job handed off there is settled by what is known of
it. A job never reported running goes back to the queue under a new nonce, avoiding that peer; one
reported running follows its ``on_peer_lost`` policy (fail, the default, or requeue); a pinned job
fails with the reason; a cancel the peer never confirmed ends the job. When the peer answers again,
every superseded incarnation there is terminated by its nonce before anything new is placed there,
and the job's output and history tell the story."""

from __future__ import annotations

from collections.abc import Callable

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.services.peer_views import peers_overview
from tests.services.world import ALICE, FakePeer, ScriptedPeer, World, event_kinds, spec, tick_until
from tests.waiting import wait_state

LOST_S = 60
RESET = PeerError(PeerErrorCode.UNAVAILABLE, "connection reset")
LOST = reasons.peer_lost("cw-h100", LOST_S * 1000)  # "Peer cw-h100 lost for 1 min; the job's state there is unknown"


def notices(world: World, job_id: str) -> list[str]:
    return [line for _, line in world.store.log_lines(job_id) if line.startswith("[iris-federation]")]


def lose(world: World, peer: ScriptedPeer, federation_tick: Callable[[], object]) -> None:
    """Take ``peer`` down and let it stay unreachable for exactly the lost period (ticking at both ends)."""
    peer.go_down()
    federation_tick()  # the first unanswered heartbeat: unreachable from now
    world.clock.advance(LOST_S * 1000)


def test_a_job_never_reported_running_goes_back_to_the_queue_and_its_old_incarnation_is_terminated_later(
    world_with: Callable[..., World],
) -> None:
    world = world_with(peer_lost_seconds=LOST_S)
    fake = FakePeer("cw-fake", world.clock)  # admits jobs and keeps them pending
    scripted = ScriptedPeer(fake)  # type: ignore[arg-type]
    first = world.federation({"cw-fake": scripted})
    first.submit(spec("/alice/stuck", "echo ran elsewhere", h100=1), submitting_user=ALICE)
    assert first.tick().delivered == ["/alice/stuck"]
    old_nonce = world.job("/alice/stuck").nonce
    federation = world.federation({"cw-fake": scripted, "cw-h100": world.peers["cw-h100"]})

    scripted.go_down()
    assert federation.tick().requeued == []  # unreachable from now
    world.clock.advance(LOST_S * 1000 - 1)
    report = federation.tick()
    assert report.requeued == [] and world.job("/alice/stuck").peer_id == "cw-fake"  # not lost yet
    world.clock.advance(1)
    report = federation.tick()
    lost = reasons.peer_lost("cw-fake", LOST_S * 1000)
    assert report.requeued == ["/alice/stuck"] and report.delivered == ["/alice/stuck"]  # and placed at once
    moved = world.job("/alice/stuck")
    assert (moved.peer_id, moved.requeue_count) == ("cw-h100", 1) and moved.nonce != old_nonce
    assert [(h.peer_id, h.nonce) for h in world.store.abandoned_handoffs()] == [("cw-fake", old_nonce)]
    [row] = [p for p in peers_overview(federation, world.clock())["peers"] if p["peer_id"] == "cw-fake"]
    assert row["lost"] and row["superseded_incarnations"] == 1  # the Federation page says so
    assert tick_until(federation, world.store, "/alice/stuck", JobState.SUCCEEDED).nonce == moved.nonce

    scripted.come_back()
    assert federation.tick().cancelled == ["/alice/stuck"]  # what it left there is terminated by its nonce
    assert fake.jobs["/alice/stuck"].state is JobState.KILLED and fake.jobs["/alice/stuck"].nonce == old_nonce
    assert world.store.abandoned_handoffs() == []
    assert world.job("/alice/stuck").state is JobState.SUCCEEDED  # the new incarnation is untouched
    kinds = event_kinds(world.store, "/alice/stuck")
    assert kinds.index("peer_lost") < kinds.index("requeued") < kinds.index("stray_terminated")
    said = notices(world, "/alice/stuck")
    assert said[0].startswith("[iris-federation] Back in the queue: peer cw-fake was lost")
    assert f"requeue 1 of 3: {lost}" in said[0]
    assert said[-1].startswith(
        f"[iris-federation] Peer cw-fake answered again and terminated the incarnation {old_nonce[:8]}"
    )


def test_a_running_job_on_a_lost_peer_fails_and_its_retry_runs_only_once_the_old_one_is_stopped(
    world_with: Callable[..., World],
) -> None:
    world = world_with(peer_lost_seconds=LOST_S)
    peer = world.peers["cw-h100"]
    federation = world.federation()
    job = spec("/alice/train", world.held("train"), h100=1)
    federation.submit(job, submitting_user=ALICE)
    old = tick_until(federation, world.store, "/alice/train", JobState.RUNNING)

    lose(world, peer, federation.tick)
    report = federation.tick()
    assert report.lost == ["/alice/train"]
    failed = world.job("/alice/train")
    assert (failed.state, failed.error) == (JobState.FAILED, LOST)
    assert notices(world, "/alice/train")[-1] == (
        f"[iris-federation] {LOST}. The incarnation left there is terminated if the peer answers again"
    )
    running_there = world.peer_backend("cw-h100").status("/alice/train")
    assert running_there is not None and running_there.state is JobState.RUNNING  # cut off, not dead

    peer.come_back()
    peer.errors["terminate"] = RESET  # it answers again, but cannot be made to stop the old one yet
    federation.tick()
    retry = federation.submit(job, submitting_user=ALICE).job  # the task's retry: a new incarnation
    assert retry is not None and retry.nonce != old.nonce and retry.handoff_state is HandoffState.QUEUED
    assert federation.tick().promoted == []  # never beside the incarnation still to be stopped there
    del peer.errors["terminate"]
    federation.tick()  # told to stop it
    wait_state(world.peer_backend("cw-h100"), "/alice/train", JobState.KILLED, timeout=15)
    federation.tick()  # over there now: forgotten, and the peer is free for the retry
    assert world.store.abandoned_handoffs() == []
    assert tick_until(federation, world.store, "/alice/train", JobState.RUNNING).nonce == retry.nonce
    world.release("train")
    done = tick_until(federation, world.store, "/alice/train", JobState.SUCCEEDED)
    assert done.nonce == retry.nonce
    kinds = event_kinds(world.store, "/alice/train")
    assert kinds.index("stray_terminated") < len(kinds) - 1 - kinds[::-1].index("handed_off")  # stopped first


def test_a_running_job_that_asks_for_it_is_requeued_elsewhere(world_with: Callable[..., World]) -> None:
    world = world_with(peer_lost_seconds=LOST_S)
    world.add_peer("cw-spare", h100=4)
    peer = world.peers["cw-h100"]
    federation = world.federation()
    job = spec("/alice/ckpt", world.held("ckpt"), h100=1, on_peer_lost="requeue")
    federation.submit(job, submitting_user=ALICE)
    assert tick_until(federation, world.store, "/alice/ckpt", JobState.RUNNING).peer_id == "cw-h100"

    lose(world, peer, federation.tick)
    report = federation.tick()
    assert report.requeued == ["/alice/ckpt"] and report.lost == []
    assert tick_until(federation, world.store, "/alice/ckpt", JobState.RUNNING).peer_id == "cw-spare"
    peer.come_back()
    federation.tick()
    wait_state(world.peer_backend("cw-h100"), "/alice/ckpt", JobState.KILLED, timeout=15)
    federation.tick()
    assert world.store.abandoned_handoffs() == []
    world.release("ckpt")
    assert tick_until(federation, world.store, "/alice/ckpt", JobState.SUCCEEDED).peer_id == "cw-spare"
    old = world.peer_backend("cw-h100").status("/alice/ckpt")
    assert old is not None and old.state is JobState.KILLED  # it did not finish there too


def test_a_pinned_job_on_a_lost_peer_fails_with_the_reason(lite_with: Callable[..., World]) -> None:
    world = lite_with(peer_lost_seconds=LOST_S)
    fake = FakePeer("cw-fake", world.clock)
    scripted = ScriptedPeer(fake)  # type: ignore[arg-type]
    federation = world.federation({"cw-fake": scripted})
    federation.submit(spec("/alice/pinned", h100=1, pin="cw-fake", on_peer_lost="requeue"), submitting_user=ALICE)
    federation.tick()
    lose(world, scripted, federation.tick)
    assert federation.tick().lost == ["/alice/pinned"]
    job = world.job("/alice/pinned")
    assert (job.state, job.error) == (JobState.FAILED, reasons.peer_lost("cw-fake", LOST_S * 1000))


def test_a_cancel_the_lost_peer_never_confirmed_ends_the_job(lite_with: Callable[..., World]) -> None:
    world = lite_with(peer_lost_seconds=LOST_S)
    peer = world.peers["cw-h100"]
    federation = world.federation()
    federation.submit(spec("/alice/unwanted", world.held("unwanted"), h100=1), submitting_user=ALICE)
    tick_until(federation, world.store, "/alice/unwanted", JobState.RUNNING)
    peer.go_down()
    assert not federation.cancel("/alice/unwanted").killed  # it cannot be told
    lose(world, peer, federation.tick)
    assert federation.tick().lost == ["/alice/unwanted"]
    job = world.job("/alice/unwanted")
    assert (job.state, job.error) == (JobState.KILLED, reasons.cancel_unconfirmed(LOST))
    assert world.store.pending_cancels() == []  # handed to the stray cleanup, not re-driven for ever
    peer.come_back()
    federation.tick()
    wait_state(world.peer_backend("cw-h100"), "/alice/unwanted", JobState.KILLED, timeout=15)


def test_a_peer_removed_from_the_cluster_file_is_lost_at_once(lite: World) -> None:
    federation = lite.federation()
    federation.submit(spec("/alice/there", lite.held("there"), h100=1), submitting_user=ALICE)
    tick_until(federation, lite.store, "/alice/there", JobState.RUNNING)
    # Pinned, and queued behind the running one: 4 h100 is all the peer has.
    federation.submit(spec("/alice/waiting", h100=4, pin="cw-h100"), submitting_user=ALICE)
    without = lite.federation({"cw-gb200": lite.peers["cw-gb200"]})
    report = without.tick()
    assert sorted(report.lost) == ["/alice/there", "/alice/waiting"]
    there = lite.job("/alice/there")
    assert (there.state, there.error) == (JobState.FAILED, reasons.peer_removed("cw-h100"))
    waiting = lite.job("/alice/waiting")
    assert (waiting.state, waiting.error) == (JobState.UNSCHEDULABLE, reasons.pinned_peer_removed("cw-h100"))
    # Configured again (within the week leftovers on a removed peer are kept): what it holds is stopped.
    lite.federation().tick()
    wait_state(lite.peer_backend("cw-h100"), "/alice/there", JobState.KILLED, timeout=15)


def test_a_peer_that_answers_within_the_period_keeps_its_jobs(lite_with: Callable[..., World]) -> None:
    world = lite_with(peer_lost_seconds=LOST_S)
    peer = world.peers["cw-h100"]
    federation = world.federation()
    federation.submit(spec("/alice/patient", world.held("patient"), h100=1), submitting_user=ALICE)
    tick_until(federation, world.store, "/alice/patient", JobState.RUNNING)
    peer.go_down()
    federation.tick()
    world.clock.advance(LOST_S * 1000 - 1)
    peer.come_back()
    federation.tick()  # it answered: its unreachable clock starts again from the next failure
    peer.go_down()
    federation.tick()
    world.clock.advance(LOST_S * 1000 - 1)
    report = federation.tick()
    assert report.lost == [] and report.requeued == []
    assert world.job("/alice/patient").state is JobState.RUNNING
    peer.come_back()
    world.release("patient")
    tick_until(federation, world.store, "/alice/patient", JobState.SUCCEEDED)

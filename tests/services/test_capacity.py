"""Capacity you can trust, through the services: no double-booking across ticks, no job that can
never fit, spreading that lasts, no starving big jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.reservations import RESERVED_NOTE
from iris_airflow_provider.core.router import Disposition
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.services.job_views import job_explanation, never_fitting
from iris_airflow_provider.services.peer_views import peers_overview
from tests.services.world import ALICE, FakePeer, ScriptedPeer, World, spec, tick_until

SECOND = 1_000


class TestNoDoubleBooking:
    def test_a_peer_whose_delivered_jobs_stay_queued_gets_one_job_not_one_per_tick(self, world: World) -> None:
        """The issue's reproduction: 8 free h100 advertised on every heartbeat (a newer observation
        each time) while the delivered jobs wait in the peer's queue holding nothing."""
        lagging = FakePeer("cw-lag", world.clock, h100=8)
        federation = world.federation({"cw-lag": lagging})
        for n in range(3):
            federation.submit(spec(f"/alice/big-{n}", h100=8), submitting_user=ALICE)
        promoted = []
        for _ in range(3):
            promoted += federation.tick().promoted
            world.clock.advance(SECOND)
        assert promoted == ["/alice/big-0->cw-lag/default"]
        assert sorted(lagging.jobs) == ["/alice/big-0"]
        waiting = job_explanation(federation, world.job("/alice/big-1"), world.clock())
        [row] = waiting["explanation"]["peers"][0]["backends"]
        assert (row["reserved"], row["reserved_note"]) == ({"h100": 8}, RESERVED_NOTE)
        assert RESERVED_NOTE in waiting["summary"]
        [peer] = peers_overview(federation, world.clock())["peers"]
        [backend] = peer["backends"]
        assert backend["reserved"] == {"h100": 8} and backend["reserved_jobs"] == ["/alice/big-0"]
        assert backend["reserved_note"] == f"8 h100 {RESERVED_NOTE} (1 job)"

        # The peer starts it and its next heartbeat shows it holding the 8: nothing is reserved any
        # more, and nothing is free either.
        lagging.jobs["/alice/big-0"] = replace(lagging.jobs["/alice/big-0"], state=JobState.RUNNING)
        federation.tick()  # the sync after this tick's heartbeat sees it running
        lagging.h100 = 0
        world.clock.advance(SECOND)
        assert federation.tick().promoted == []
        [backend] = peers_overview(federation, world.clock())["peers"][0]["backends"]
        assert backend["reserved"] == {}
        # It finishes: the very next heartbeat's 8 free go to the next job.
        lagging.jobs["/alice/big-0"] = replace(lagging.jobs["/alice/big-0"], state=JobState.SUCCEEDED)
        federation.tick()
        lagging.h100 = 8
        world.clock.advance(SECOND)
        assert federation.tick().promoted == ["/alice/big-1->cw-lag/default"]

    def test_a_process_backend_that_queues_work_is_not_over_assigned(self, world: World) -> None:
        """A real peer backend at ``max_running_jobs``: it queues what it is handed and keeps
        advertising the devices the queued jobs will take as free."""
        backend = ProcessBackend("default", world.tmp_path / "cw-busy", devices={"h100": 8}, max_running_jobs=1)
        world.real_peers["cw-busy"] = AgentlessPeer("cw-busy", [backend], allowed_submitters=["*@example.com"])
        busy = world.peers["cw-busy"] = ScriptedPeer(world.real_peers["cw-busy"])
        federation = world.federation({"cw-busy": busy})
        federation.submit(spec("/alice/first", world.held("first"), h100=2), submitting_user=ALICE)
        tick_until(federation, world.store, "/alice/first", JobState.RUNNING)
        for n in range(3):
            federation.submit(spec(f"/alice/queued-{n}", "true", h100=4), submitting_user=ALICE)
        promoted = []
        for _ in range(4):
            world.clock.advance(SECOND)
            promoted += federation.tick().promoted
        # 6 free, every tick: one 4-GPU job was handed off (and waits there), not three.
        assert backend.describe().availability.amounts == {"h100": 6}
        assert promoted == ["/alice/queued-0->cw-busy/default"]
        assert world.job("/alice/queued-0").state is JobState.PENDING
        # The first ends, the queued one starts there: the 4 it takes show, and the next one fits.
        world.release("first")
        tick_until(federation, world.store, "/alice/queued-0", JobState.RUNNING, JobState.SUCCEEDED)
        world.clock.advance(SECOND)
        done = tick_until(federation, world.store, "/alice/queued-1", JobState.SUCCEEDED)
        assert done.peer_id == "cw-busy"


class TestNeverFits:
    def test_a_job_bigger_than_every_matching_backend_is_rejected_at_submit(self, world: World) -> None:
        federation = world.federation()
        federation.tick()  # heartbeats: cw-h100 has 4 h100 in total
        submitted = federation.submit(spec("/a/big", h100=16), submitting_user=ALICE)
        assert submitted.decision.disposition is Disposition.REJECT and submitted.job is None
        assert submitted.decision.reason == (
            "Job /a/big needs 16 h100 on one backend; the largest that can host it is cw-h100/default with 4 in total"
        )
        assert world.store.get_job("/a/big") is None

    def test_a_queued_job_whose_peer_shrank_stays_queued_and_says_it_can_never_fit(self, world: World) -> None:
        federation = world.federation()
        federation.submit(spec("/alice/hog", world.held("hog"), h100=4), submitting_user=ALICE)
        tick_until(federation, world.store, "/alice/hog", JobState.RUNNING)
        federation.submit(spec("/alice/four", h100=4), submitting_user=ALICE)
        federation.tick()
        assert world.job("/alice/four").handoff_state is HandoffState.QUEUED
        # cw-h100 comes back with 2 devices in all.
        world.add_peer("cw-h100", h100=2)
        federation = world.federation()
        world.clock.advance(SECOND)
        federation.tick()
        job = world.job("/alice/four")
        assert (job.handoff_state, job.state) == (HandoffState.QUEUED, JobState.PENDING)
        explained = job_explanation(federation, job, world.clock())
        assert explained["status"] == "never_fits"
        assert explained["summary"].startswith(
            "No reachable backend can ever hold it: Job /alice/four needs 4 h100 on one backend; the largest "
            "that can host it is cw-h100/default with 2 in total."
        )
        assert never_fitting(federation, [job, world.job("/alice/hog")], world.clock()) == {"/alice/four"}
        world.release("hog")


class TestSpreading:
    def test_one_ungated_job_per_tick_still_spreads_across_peers(self, world: World) -> None:
        """GPU jobs of variant ``auto`` are ungated; held running, each stays in flight on its peer."""
        federation = world.federation()
        landed = []
        for n in range(4):
            auto = parse_job(
                {
                    "job_id": f"/alice/gpu-auto-{n}",
                    "command": world.held(f"gpu-auto-{n}"),
                    "resources": {"device": {"type": "gpu", "count": 1}},
                }
            )
            federation.submit(auto, submitting_user=ALICE)
            report = federation.tick()
            world.clock.advance(SECOND)
            landed += [promoted.split("->")[1] for promoted in report.promoted]
        assert landed == ["cw-gb200/default", "cw-h100/default", "cw-gb200/default", "cw-h100/default"]
        for n in range(4):
            world.release(f"gpu-auto-{n}")


class TestNoStarvation:
    def test_a_big_job_behind_a_stream_of_small_ones_holds_the_backend_and_runs(
        self, world_with: Callable[..., World]
    ) -> None:
        world = world_with(reserve_after_seconds=60)
        federation = world.federation()
        for name in ("s1", "s2"):
            federation.submit(spec(f"/bob/{name}", world.held(name), h100=2), submitting_user=ALICE)
        tick_until(federation, world.store, "/bob/s1", JobState.RUNNING)
        tick_until(federation, world.store, "/bob/s2", JobState.RUNNING)
        federation.submit(spec("/alice/big", h100=4), submitting_user=ALICE)
        world.clock.advance(SECOND)
        federation.submit(spec("/bob/s3", world.held("s3"), h100=2), submitting_user=ALICE)
        assert federation.tick().holding == []  # not waiting long enough yet
        world.clock.advance(61 * SECOND)
        report = federation.tick()
        assert report.holding == ["cw-h100/default for /alice/big"]
        assert world.store.capacity_holds() == {"/alice/big": ("cw-h100", "default")}

        # s1 ends: 2 h100 free up, which s3 would take at once without the hold.
        world.release("s1")
        tick_until(federation, world.store, "/bob/s1", JobState.SUCCEEDED)
        assert federation.tick().promoted == []
        assert world.job("/bob/s3").handoff_state is HandoffState.QUEUED
        explained = job_explanation(federation, world.job("/bob/s3"), world.clock())
        assert "holding cw-h100/default for /alice/big (waiting 1 min)" in explained["summary"]
        held = job_explanation(federation, world.job("/alice/big"), world.clock())
        assert held["status"] == "holding"
        assert held["summary"].startswith("It has waited 1 min, so it holds cw-h100/default")
        assert "2 of its 4 h100 are available there now" in held["summary"]
        [backend] = next(p for p in peers_overview(federation, world.clock())["peers"] if p["peer_id"] == "cw-h100")[
            "backends"
        ]
        assert backend["held_for"]["text"] == "holding cw-h100/default for /alice/big (waiting 1 min)"

        # s2 ends too: the big job fits, is promoted first, and its hold ends.
        world.release("s2")
        done = tick_until(federation, world.store, "/alice/big", JobState.SUCCEEDED)
        assert done.peer_id == "cw-h100"
        assert "/alice/big" not in world.store.capacity_holds()  # s3, starving by now too, holds it next
        order = [e for e in world.store.events("/alice/big") if e.kind == "promoted"]
        s3 = [e for e in world.store.events("/bob/s3") if e.kind == "promoted"]
        assert not s3 or s3[0].seq > order[0].seq
        world.release("s3")
        tick_until(federation, world.store, "/bob/s3", JobState.SUCCEEDED)

    def test_holding_is_off_with_zero(self, world_with: Callable[..., World]) -> None:
        world = world_with(reserve_after_seconds=0)
        federation = world.federation()
        federation.submit(spec("/bob/s1", world.held("s1"), h100=2), submitting_user=ALICE)
        tick_until(federation, world.store, "/bob/s1", JobState.RUNNING)
        federation.submit(spec("/alice/big", h100=4), submitting_user=ALICE)
        world.clock.advance(10**9)
        federation.submit(spec("/bob/s2", world.held("s2"), h100=2), submitting_user=ALICE)
        report = federation.tick()
        assert report.holding == [] and report.promoted == ["/bob/s2->cw-h100/default"]
        world.release("s1")
        world.release("s2")

"""The tick lease: however ticks are started (the schedule, a manual trigger, a second deployment on
the same store), two never overlap. A tick that finds the lease held skips; a killed tick's lease
expires; a tick that outlived its lease stops before its next write."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.tick import TICK_LEASE, TICK_LEASE_MS, TickReport
from iris_airflow_provider.store.records import Origin
from tests.services.world import ALICE, World, spec

HELD = f"another tick holds the {TICK_LEASE} lease"


def queue_gpu_jobs(federation: Federation, count: int) -> None:
    for n in range(count):
        job = spec(f"/alice/j{n}", h100=4)  # cw-h100 has 4 h100: one at a time
        federation.submit(job, submitting_user=ALICE, origin=Origin("train", f"run{n}", "fit"))


class GatedTick:
    """A tick in another thread, held inside its lease (at its first step, Airflow's task states)
    until released: what a slow tick looks like to a second one."""

    def __init__(self, federation: Federation, before_release: Callable[[], None] = lambda: None) -> None:
        self.inside, self.released = threading.Event(), threading.Event()
        self.before_release = before_release
        self.reports: list[TickReport] = []
        self.thread = threading.Thread(target=lambda: self.reports.append(federation.tick(task_states=self._states)))

    def _states(self, dag_id: str, run_ids: list[str], task_ids: list[str]) -> Mapping[str, Mapping[str, Any]]:
        self.inside.set()
        assert self.released.wait(10)
        return {}

    def __enter__(self) -> GatedTick:
        self.thread.start()
        assert self.inside.wait(10), "the first tick never reached its first step"
        return self

    def release(self) -> TickReport:
        self.released.set()
        self.thread.join(10)
        [report] = self.reports
        return report

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.thread.join(10)


def test_a_tick_started_while_another_runs_skips_and_nothing_is_placed_twice(world: World) -> None:
    federation = world.federation()
    queue_gpu_jobs(federation, 3)
    peer = world.peers["cw-h100"]
    heartbeats = peer.count("heartbeat")  # submitting asked once, to classify
    with GatedTick(federation) as first:
        second = federation.tick()
        assert second.skipped == HELD and second.summary() == f"skipped: {HELD}"
        assert (second.heartbeats, second.promoted, second.delivered) == ({}, [], [])
        assert (peer.count("heartbeat"), peer.count("deliver")) == (heartbeats, 0)
        report = first.release()
    assert not report.skipped and report.promoted == ["/alice/j0->cw-h100/default"]
    assert world.peers["cw-h100"].count("deliver") == 1
    assert not federation.tick().skipped  # released: the next tick runs


def test_a_killed_ticks_lease_expires_and_the_next_tick_takes_over(world: World) -> None:
    federation = world.federation()
    queue_gpu_jobs(federation, 1)
    assert world.store.acquire_lease(TICK_LEASE, "a-tick-that-was-killed", world.clock(), TICK_LEASE_MS)
    assert federation.tick().skipped == HELD
    world.clock.advance(TICK_LEASE_MS)
    report = federation.tick()
    assert not report.skipped and report.promoted == ["/alice/j0->cw-h100/default"]


def test_a_tick_that_outlived_its_lease_stops_before_its_next_write(world: World) -> None:
    federation = world.federation()
    queue_gpu_jobs(federation, 1)
    with GatedTick(federation) as slow:
        world.clock.advance(TICK_LEASE_MS)  # it stalled past its lease, and another tick took over
        assert world.store.acquire_lease(TICK_LEASE, "the-tick-that-took-over", world.clock(), TICK_LEASE_MS)
        report = slow.release()
    assert report.skipped == f"the {TICK_LEASE} lease expired before lost peers; another tick may be running"
    assert report.promoted == [] and world.store.get_job("/alice/j0").peer_id == ""
    # Its release did not free the lease the other tick holds.
    assert federation.tick().skipped == HELD


def test_sequential_ticks_each_take_and_free_the_lease(world: World) -> None:
    federation = world.federation()
    assert not federation.tick().skipped
    assert not federation.tick().skipped
    assert world.store.acquire_lease(TICK_LEASE, "someone", world.clock(), TICK_LEASE_MS)

"""Band eviction on a backend (``core.eviction.plan_pass``): examples of each rule, then properties
over random queues, running sets and limits."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.eviction import (
    Limits,
    QueuedJob,
    RunningJob,
    SchedulePlan,
    Start,
    eviction_order,
    free_slots,
    plan_pass,
)

P, PR, IN, B = Band.PRODUCTION, Band.PRIORITY, Band.INTERACTIVE, Band.BATCH


def q(job_id: str, band: Band = IN, at: int = 0, **need: int) -> QueuedJob:
    return QueuedJob(job_id, band, at, need)


def r(
    job_id: str, band: Band = IN, started: int = 0, *, evicting: bool = False, **slots: tuple[int, ...]
) -> RunningJob:
    return RunningJob(job_id, band, slots, started, evicting)


def h100(slots: int, max_running_jobs: int | None = None) -> Limits:
    return Limits({"h100": slots}, max_running_jobs)


# Starting ---------------------------------------------------------------------------------------


def test_nothing_queued_plans_nothing() -> None:
    assert plan_pass([], [r("a", h100=(0,))], h100(4)) == SchedulePlan()


def test_a_job_that_fits_starts_on_the_lowest_free_slots() -> None:
    planned = plan_pass([q("new", h100=2)], [r("old", h100=(0, 2))], h100(8))
    assert planned == SchedulePlan(starts=(Start("new", {"h100": (1, 3)}),))


def test_jobs_start_in_band_order_then_submit_order_then_job_id() -> None:
    queued = [
        q("batch", B, 1, h100=1),
        q("late", IN, 9, h100=1),
        q("b-early", IN, 2, h100=1),
        q("a-early", IN, 2, h100=1),
    ]
    planned = plan_pass(queued, [], h100(3))
    assert [s.job_id for s in planned.starts] == ["a-early", "b-early", "late"]
    assert [s.slots for s in planned.starts] == [{"h100": (0,)}, {"h100": (1,)}, {"h100": (2,)}]


def test_a_job_that_does_not_fit_does_not_block_a_smaller_one_behind_it() -> None:
    planned = plan_pass([q("big", IN, 1, h100=4), q("small", IN, 2, h100=1)], [r("x", IN, h100=(0, 1))], h100(4))
    assert planned == SchedulePlan(starts=(Start("small", {"h100": (2,)}),))


def test_a_job_without_devices_starts_even_when_every_slot_is_taken() -> None:
    planned = plan_pass([q("cpu")], [r("x", h100=(0, 1))], h100(2))
    assert planned.starts == (Start("cpu", {}),) and planned.evictions == ()


def test_a_variant_the_backend_lacks_never_starts_nor_evicts() -> None:
    planned = plan_pass([q("a100", P, a100=1)], [r("x", B, h100=(0,))], h100(1))
    assert planned == SchedulePlan()


# Evicting ---------------------------------------------------------------------------------------


def test_a_higher_band_evicts_lower_band_work_that_frees_enough() -> None:
    planned = plan_pass([q("urgent", P, h100=2)], [r("batch", B, h100=(0, 1))], h100(2))
    assert planned == SchedulePlan(evictions=("batch",))  # it starts once the victim has stopped


def test_eviction_takes_the_lowest_band_first_then_the_newest() -> None:
    running = [
        r("old-batch", B, 1, h100=(0,)),
        r("new-batch", B, 2, h100=(1,)),
        r("interactive", IN, 3, h100=(2,)),
    ]
    assert plan_pass([q("prod", P, h100=1)], running, h100(3)).evictions == ("new-batch",)
    assert plan_pass([q("prod", P, h100=2)], running, h100(3)).evictions == ("new-batch", "old-batch")
    assert plan_pass([q("prod", P, h100=3)], running, h100(3)).evictions == ("new-batch", "old-batch", "interactive")
    assert [j.job_id for j in eviction_order(P, running, set())] == ["new-batch", "old-batch", "interactive"]


def test_equal_or_higher_bands_are_never_evicted() -> None:
    running = [r("same", IN, h100=(0,)), r("higher", P, h100=(1,))]
    assert plan_pass([q("interactive", IN, h100=2), q("batch", B, h100=1)], running, h100(2)) == SchedulePlan()


def test_nothing_is_evicted_when_evicting_every_lower_band_job_would_not_be_enough() -> None:
    running = [r("batch", B, h100=(0,)), r("interactive", IN, h100=(1,)), r("prod", P, h100=(2,))]
    assert plan_pass([q("prod2", P, h100=3)], running, h100(3)) == SchedulePlan()  # may evict 2 of 3
    assert plan_pass([q("prio", PR, h100=2)], running, h100(3)) == SchedulePlan(evictions=("batch", "interactive"))
    assert plan_pass([q("interactive2", IN, h100=2)], running[:2], h100(2)) == SchedulePlan()


def test_jobs_holding_none_of_the_needed_variant_are_not_evicted() -> None:
    limits = Limits({"h100": 1, "a100": 1})
    running = [r("a100-batch", B, 5, a100=(0,)), r("h100-batch", B, 1, h100=(0,))]
    assert plan_pass([q("prod", P, h100=1)], running, limits).evictions == ("h100-batch",)


def test_slots_of_work_already_being_evicted_count_as_freed_and_are_claimed_once() -> None:
    running = [r("draining", B, 1, evicting=True, h100=(0,)), r("batch", B, 2, h100=(1,))]
    # The first job counts on the draining slot: nobody else is evicted for it.
    assert plan_pass([q("prod", P, h100=1)], running, h100(2)) == SchedulePlan()
    # The second cannot count on that slot too: it evicts the other batch job.
    assert plan_pass([q("prod", P, 1, h100=1), q("prod2", P, 2, h100=1)], running, h100(2)).evictions == ("batch",)


def test_a_draining_job_is_not_evicted_twice() -> None:
    running = [r("draining", B, evicting=True, h100=(0, 1))]
    assert plan_pass([q("prod", P, h100=2)], running, h100(2)) == SchedulePlan()
    assert eviction_order(P, running, {"draining"}) == []


def test_a_job_evicted_earlier_in_the_pass_is_not_a_candidate_again() -> None:
    running = [r("batch", B, h100=(0, 1))]
    planned = plan_pass([q("prod", P, 1, h100=2), q("prio", PR, 2, h100=2)], running, h100(2))
    assert planned.evictions == ("batch",)


# Run slots (max_running_jobs) -------------------------------------------------------------------


def test_max_running_jobs_stops_the_pass() -> None:
    planned = plan_pass([q("a", IN, 1), q("b", IN, 2), q("c", IN, 3)], [], Limits({}, 2))
    assert [s.job_id for s in planned.starts] == ["a", "b"]
    assert plan_pass([q("same", IN)], [r("x", IN), r("y", IN)], Limits({}, 2)) == SchedulePlan()


def test_a_higher_band_frees_a_run_slot_by_evicting_the_lowest_band_newest_job() -> None:
    running = [r("old", B, 1), r("new", B, 2), r("inter", IN, 3)]
    assert plan_pass([q("urgent", P)], running, Limits({}, 3)) == SchedulePlan(evictions=("new",))


def test_only_one_run_slot_is_freed_at_a_time() -> None:
    running = [r("old", B, 1), r("new", B, 2, evicting=True)]
    assert plan_pass([q("urgent", P), q("urgent2", P, 1)], running, Limits({}, 2)) == SchedulePlan()


def test_a_device_eviction_in_the_pass_also_counts_as_a_run_slot_on_its_way() -> None:
    running = [r("batch", B, 1, h100=(0,)), r("other-batch", B, 2)]
    queued = [q("prod", P, 1, h100=1), q("prod-cpu", P, 2), q("prod-cpu2", P, 3)]
    planned = plan_pass(queued, running, Limits({"h100": 1}, 3))
    # "batch" is evicted for its device; the run limit then reached evicts nobody else.
    assert planned == SchedulePlan(starts=(Start("prod-cpu", {}),), evictions=("batch",))
    # Already at the run limit, the head of the queue frees a run slot: the newest batch job.
    assert plan_pass(queued, running, Limits({"h100": 1}, 2)) == SchedulePlan(evictions=("other-batch",))


def test_lower_bands_may_not_take_a_run_slot() -> None:
    assert plan_pass([q("batch", B)], [r("inter", IN)], Limits({}, 1)) == SchedulePlan()


# Helpers ----------------------------------------------------------------------------------------


def test_free_slots_lists_unheld_slots_of_each_variant() -> None:
    running = [r("a", h100=(1, 3)), r("b", a100=(0,)), r("c", tpu=(0,))]
    assert free_slots({"h100": 4, "a100": 1}, running) == {"h100": (0, 2), "a100": ()}


# Properties -------------------------------------------------------------------------------------

VARIANTS = ("h100", "a100")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[QueuedJob], list[RunningJob], Limits]:
    devices = {v: draw(st.integers(0, 6)) for v in draw(st.lists(st.sampled_from(VARIANTS), unique=True))}
    limit = draw(st.one_of(st.none(), st.integers(1, 5)))
    running: list[RunningJob] = []
    taken: dict[str, set[int]] = {v: set() for v in devices}
    for index in range(draw(st.integers(0, 6))):
        slots: dict[str, tuple[int, ...]] = {}
        for variant in draw(st.lists(st.sampled_from(sorted(devices) or ["h100"]), max_size=1)):
            free = [s for s in range(devices.get(variant, 0)) if s not in taken.get(variant, set())]
            if free:
                chosen = draw(st.lists(st.sampled_from(free), min_size=1, max_size=len(free), unique=True))
                taken[variant].update(chosen)
                slots[variant] = tuple(sorted(chosen))
        band = draw(st.sampled_from(list(Band)))
        started = draw(st.integers(0, 1_000)) * 10 + index  # distinct: ties would depend on list order
        running.append(RunningJob(f"r{index}", band, slots, started, draw(st.booleans()) and draw(st.booleans())))
    queued = [
        QueuedJob(
            f"q{index}",
            draw(st.sampled_from(list(Band))),
            draw(st.integers(0, 5)),
            {v: draw(st.integers(1, 7)) for v in draw(st.lists(st.sampled_from(VARIANTS), max_size=1))},
        )
        for index in range(draw(st.integers(0, 6)))
    ]
    return queued, running, Limits(devices, limit)


@given(scenarios())
@settings(max_examples=400, deadline=None)
def test_property_starts_fit_the_devices_and_the_run_limit(scenario) -> None:
    queued, running, limits = scenario
    planned = plan_pass(queued, running, limits)
    by_id = {job.job_id: job for job in queued}
    held = {v: {s for job in running for s in job.slots.get(v, ())} for v in limits.devices}
    for start in planned.starts:
        assert {v: len(s) for v, s in start.slots.items()} == dict(by_id[start.job_id].need)  # exactly its need
        for variant, slots in start.slots.items():
            assert all(0 <= s < limits.devices[variant] for s in slots)
            assert not held[variant] & set(slots), "a slot handed out twice"
            held[variant].update(slots)
    if limits.max_running_jobs is not None and planned.starts:
        assert len(running) + len(planned.starts) <= limits.max_running_jobs


@given(scenarios())
@settings(max_examples=400, deadline=None)
def test_property_never_evicts_an_equal_or_higher_band_nor_twice(scenario) -> None:
    queued, running, limits = scenario
    planned = plan_pass(queued, running, limits)
    by_id = {job.job_id: job for job in running}
    assert len(set(planned.evictions)) == len(planned.evictions)
    started = {s.job_id for s in planned.starts}
    waiting = [job for job in queued if job.job_id not in started]
    for victim_id in planned.evictions:
        victim = by_id[victim_id]  # only running work is evicted
        assert not victim.evicting, "already on its way out"
        assert any(job.band.outranks(victim.band) for job in waiting), "evicted for nobody that outranks it"


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_property_the_plan_does_not_depend_on_the_order_of_its_inputs(scenario) -> None:
    queued, running, limits = scenario
    shuffled = random.Random(len(queued) * 7 + len(running))
    queued_again, running_again = list(queued), list(running)
    shuffled.shuffle(queued_again)
    shuffled.shuffle(running_again)
    assert plan_pass(queued_again, running_again, limits) == plan_pass(queued, running, limits)


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_property_starts_follow_queue_order_and_nothing_is_evicted_when_all_fit(scenario) -> None:
    queued, running, limits = scenario
    planned = plan_pass(queued, running, limits)
    order = [job.job_id for job in sorted(queued, key=QueuedJob.queue_key)]
    positions = [order.index(s.job_id) for s in planned.starts]
    assert positions == sorted(positions)
    if len(planned.starts) == len(queued):
        assert planned.evictions == ()


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_property_jobs_of_the_lowest_band_never_evict(scenario) -> None:
    queued, running, limits = scenario
    lowest = [QueuedJob(j.job_id, Band.BATCH, j.submitted_at_ms, j.need) for j in queued]
    assert plan_pass(lowest, running, limits).evictions == ()

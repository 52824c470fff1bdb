"""Big jobs must not starve: a gated job that has waited long enough holds the backend where it would
fit soonest, and nothing behind it in the queue is placed there until it is."""

from __future__ import annotations

from dataclasses import replace

from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.holds import Hold, waited
from iris_airflow_provider.core.placement import plan
from tests.core.builders import NOW, backend, cpu_job, gpu, job, peer

RESERVE_AFTER = 1_800_000
OLD = NOW - 41 * 60_000  # waited 41 min: past the 30 min default


def run(jobs, peers, **kwargs):
    kwargs.setdefault("reserve_after_ms", RESERVE_AFTER)
    return plan(jobs, peers, now_ms=NOW, **kwargs)


def placed(result):
    return {p.job_id: (p.peer_id, p.backend_id) for p in result.promotions}


def holds(result):
    return [(h.job_id, h.peer_id, h.backend_id) for h in result.holds]


def h100(backend_id: str, free: int, total: int | None = 32, **kwargs):
    return gpu(backend_id, "h100", free, total=None if total is None else {"h100": total}, **kwargs)


class TestTheStream:
    def test_a_big_job_that_waited_long_enough_holds_the_backend_and_small_jobs_behind_it_wait(self):
        peers = [peer("cw-h100", h100("default", 8))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/bob/small", count=8, submitted=OLD + 1)]
        result = run(jobs, peers)
        assert placed(result) == {}
        assert result.holds == (Hold("/alice/big", "cw-h100", "default", {"h100": 32}, {"h100": 8}, 41 * 60_000),)
        assert result.holds[0].text() == "holding cw-h100/default for /alice/big (waiting 41 min)"
        assert result.holds[0].to_wire() == {
            "job_id": "/alice/big",
            "peer_id": "cw-h100",
            "backend_id": "default",
            "needs": {"h100": 32},
            "available": {"h100": 8},
        }

    def test_without_holding_the_small_job_takes_the_freed_capacity_every_time(self):
        peers = [peer("cw-h100", h100("default", 8))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/bob/small", count=8, submitted=OLD + 1)]
        for off in (None, 0):
            result = run(jobs, peers, reserve_after_ms=off)
            assert (placed(result), result.holds) == ({"/bob/small": ("cw-h100", "default")}, ())

    def test_a_job_that_has_not_waited_long_enough_holds_nothing(self):
        peers = [peer("cw-h100", h100("default", 8))]
        just = NOW - RESERVE_AFTER  # waited exactly reserve_after: not longer
        result = run([job("/alice/big", count=32, submitted=just), job("/bob/small", submitted=just + 1)], peers)
        assert (placed(result), result.holds) == ({"/bob/small": ("cw-h100", "default")}, ())

    def test_jobs_earlier_in_the_queue_may_still_use_the_held_backend(self):
        peers = [peer("cw-h100", h100("default", 16))]
        jobs = [
            job("/carol/urgent", count=8, band="production", submitted=NOW - 1),
            job("/alice/big", count=32, submitted=OLD),
            job("/bob/small", count=8, submitted=OLD + 1),
        ]
        result = run(jobs, peers)
        assert placed(result) == {"/carol/urgent": ("cw-h100", "default")}
        assert holds(result) == [("/alice/big", "cw-h100", "default")]
        assert result.holds[0].available == {"h100": 8}  # what the urgent job left

    def test_the_held_job_is_promoted_once_it_fits_and_then_holds_nothing(self):
        peers = [peer("cw-h100", h100("default", 32))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/bob/small", count=8, submitted=OLD + 1)]
        result = run(jobs, peers, previous_holds={"/alice/big": ("cw-h100", "default")})
        assert placed(result) == {"/alice/big": ("cw-h100", "default")}
        # Its hold ended; the small job, starving too now, holds the backend in turn.
        assert holds(result) == [("/bob/small", "cw-h100", "default")]

    def test_small_jobs_still_go_to_backends_that_are_not_held(self):
        peers = [peer("cw-h100", h100("default", 8)), peer("cw-other", h100("default", 8, total=8))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/bob/small", count=8, submitted=OLD + 1)]
        result = run(jobs, peers)
        assert holds(result) == [("/alice/big", "cw-h100", "default")]  # cw-other's total cannot hold 32
        assert placed(result) == {"/bob/small": ("cw-other", "default")}

    def test_ungated_jobs_behind_it_are_not_placed_on_the_held_backend_either(self):
        peers = [peer("cw", h100("a", 8), h100("b", 0, total=8))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/bob/auto", variant="auto", submitted=OLD + 1)]
        result = run(jobs, peers)
        assert holds(result) == [("/alice/big", "cw", "a")]
        assert placed(result) == {"/bob/auto": ("cw", "b")}


class TestWhichBackend:
    def test_the_one_with_most_of_the_gate_available_now_counting_what_lower_bands_hold(self):
        peers = [
            peer("a", h100("default", 8)),
            peer("b", h100("default", 4, held={Band.BATCH: 12})),  # 16 within reach of an interactive job
            peer("c", h100("default", 12, held={Band.PRODUCTION: 8})),  # 12: production cannot be reclaimed
        ]
        result = run([job("/alice/big", count=32, submitted=OLD)], peers)
        assert holds(result) == [("/alice/big", "b", "default")]
        assert result.holds[0].available == {"h100": 16}

    def test_then_the_tightest_total_then_peer_id_then_backend_id(self):
        peers = [
            peer("a", h100("default", 8, total=64)),
            peer("b", h100("y", 8, total=32), h100("x", 8, total=32)),
            peer("c", h100("default", 8, total=None)),  # an unknown total comes last
        ]
        assert holds(run([job("/alice/big", count=32, submitted=OLD)], peers)) == [("/alice/big", "b", "x")]

    def test_a_backend_whose_total_can_never_hold_the_job_is_never_held(self):
        peers = [peer("a", h100("default", 8, total=16))]
        result = run([job("/alice/big", count=32, submitted=OLD), job("/bob/small", submitted=OLD + 1)], peers)
        assert result.holds == ()
        assert placed(result) == {"/bob/small": ("a", "default")}

    def test_a_hold_stays_where_it_was_while_that_backend_still_matches(self):
        peers = [peer("a", h100("default", 8)), peer("b", h100("default", 16))]
        previous = {"/alice/big": ("a", "default")}
        assert holds(run([job("/alice/big", count=32, submitted=OLD)], peers, previous_holds=previous)) == [
            ("/alice/big", "a", "default")
        ]
        assert holds(run([job("/alice/big", count=32, submitted=OLD)], peers)) == [("/alice/big", "b", "default")]

    def test_a_hold_ends_when_its_backend_stops_matching(self):
        previous = {"/alice/big": ("a", "default")}
        peers = [peer("a", h100("default", 8), reachable=False), peer("b", h100("default", 4))]
        assert holds(run([job("/alice/big", count=32, submitted=OLD)], peers, previous_holds=previous)) == [
            ("/alice/big", "b", "default")
        ]
        # The job now avoids a (requeued from it): same.
        avoiding = replace(job("/alice/big", count=32, submitted=OLD), avoided_peer_ids=frozenset({"a"}))
        peers = [peer("a", h100("default", 8)), peer("b", h100("default", 4))]
        assert holds(run([avoiding], peers, previous_holds=previous)) == [("/alice/big", "b", "default")]

    def test_a_pinned_job_holds_only_on_its_pin(self):
        peers = [peer("a", h100("default", 16)), peer("b", h100("default", 8))]
        result = run([job("/alice/big", count=32, pin="b", submitted=OLD)], peers)
        assert holds(result) == [("/alice/big", "b", "default")]

    def test_shape_only_backends_are_never_held(self):
        peers = [peer("a", gpu("default", "h100", None))]
        result = run([job("/alice/big", count=32, submitted=OLD)], peers)
        assert placed(result) == {"/alice/big": ("a", "default")}  # shape only: promoted, the peer decides
        assert result.holds == ()


class TestOneEach:
    def test_each_backend_holds_for_one_job_and_the_next_starving_job_takes_the_next_best(self):
        peers = [peer("a", h100("default", 8)), peer("b", h100("default", 4))]
        jobs = [
            job("/alice/big", count=32, submitted=OLD),
            job("/dave/big", count=32, submitted=OLD + 1),
            job("/erin/big", count=32, submitted=OLD + 2),
        ]
        assert holds(run(jobs, peers)) == [("/alice/big", "a", "default"), ("/dave/big", "b", "default")]

    def test_queue_order_decides_who_holds_even_against_last_ticks_holds(self):
        peers = [peer("a", h100("default", 8))]
        jobs = [job("/alice/big", count=32, submitted=OLD), job("/dave/big", count=32, submitted=OLD + 1)]
        result = run(jobs, peers, previous_holds={"/dave/big": ("a", "default")})
        assert holds(result) == [("/alice/big", "a", "default")]

    def test_a_peer_at_its_per_tick_cap_can_still_be_held(self):
        peers = [peer("a", h100("default", 32))]
        jobs = [
            job("/u/auto", variant="auto", submitted=OLD - 1),
            job("/alice/big", count=32, submitted=OLD),
            job("/bob/small", submitted=OLD + 1),
        ]
        result = run(jobs, peers, max_per_peer=1)
        assert placed(result) == {"/u/auto": ("a", "default")}
        assert holds(result) == [("/alice/big", "a", "default")]
        assert result.holds[0].available == {"h100": 32}  # it fits: only the cap kept it back this tick


def test_waiting_times_read_naturally():
    assert [waited(ms) for ms in (0, 12_000, 41 * 60_000, 99 * 60_000, 185 * 60_000)] == [
        "0 s",
        "12 s",
        "41 min",
        "99 min",
        "3 h 5 min",
    ]


def test_ungated_jobs_on_backends_nobody_holds_are_unaffected():
    peers = [peer("a", backend("cpu", free={}, device_type="cpu"))]
    result = run([cpu_job("/u/cpu", submitted=OLD)], peers)
    assert placed(result) == {"/u/cpu": ("a", "cpu")}

"""Capacity handed off and not yet visible: a reservation lasts until the peer's reports show its job.

The lagging peer of the issue: it advertises the same free capacity on every heartbeat, each with a
newer observation, while the jobs delivered to it wait in its queue holding nothing.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place
from iris_airflow_provider.core.reservations import (
    RESERVED_NOTE,
    InFlight,
    active_jobs,
    as_ledger,
    in_force,
    reserved_note,
)
from tests.core.builders import NOW, backend, gpu, job, peer

RULES = PlacementRules(max_per_peer=8, staleness_ms=120_000)
H100_8 = {"h100": 8}


def lagging_peer(tick: int, *, free: int = 8, held: int = 0, observed_after: int | None = None):
    """A peer heartbeated at ``tick`` (a newer observation every time) reporting ``free`` h100 free."""
    return peer(
        "cw",
        gpu("default", "h100", free, epoch=NOW + tick, total={"h100": 16}, held={Band.INTERACTIVE: held}),
        last_contact_ms=NOW + tick,
        observed_after_ms=NOW + tick if observed_after is None else observed_after,
    )


class TestTheRule:
    def test_a_job_not_yet_seen_holding_capacity_reserves_its_gate_whatever_the_observation(self):
        waiting = InFlight("/u/a", "cw", "default", H100_8)
        assert waiting.reserves(None) and waiting.reserves(NOW) and waiting.reserves(NOW + 10**9)

    def test_a_job_seen_holding_capacity_is_released_by_numbers_asked_for_strictly_after(self):
        running = InFlight("/u/a", "cw", "default", H100_8, holding_since_ms=NOW)
        assert running.reserves(None)
        assert running.reserves(NOW - 1)
        assert running.reserves(NOW)  # the same millisecond may predate the report
        assert not running.reserves(NOW + 1)

    def test_force_routed_and_ungated_jobs_reserve_nothing(self):
        assert not InFlight("/u/a", "cw", "", H100_8).reserves(None)
        assert not InFlight("/u/a", "cw", "default", {}).reserves(None)

    def test_only_capacity_reporting_backends_of_known_peers_carry_reservations(self):
        peers = [peer("cw", gpu("default", "h100", 8), backend("shape", device_type="gpu"))]
        jobs = [
            InFlight("/u/b", "cw", "default", H100_8),
            InFlight("/u/a", "cw", "default", {"h100": 2}),
            InFlight("/u/c", "cw", "shape", H100_8),
            InFlight("/u/d", "gone", "default", H100_8),
        ]
        assert {key: [j.job_id for j in js] for key, js in in_force(jobs, peers).items()} == {
            ("cw", "default"): ["/u/a", "/u/b"]
        }
        [row] = as_ledger(jobs, peers)
        assert (row.key, row.observation_epoch_ms, dict(row.reserved)) == (
            ("cw", "default"),
            NOW - 10_000,
            {"h100": 10},
        )

    def test_every_job_in_flight_counts_towards_its_peers_load(self):
        jobs = [InFlight("/u/a", "cw", "default", H100_8), InFlight("/u/b", "cw", ""), InFlight("/u/c", "tpu", "x")]
        assert active_jobs(jobs) == {"cw": 2, "tpu": 1}

    def test_the_note_says_what_the_capacity_is_reserved_for(self):
        assert reserved_note({"h100": 8}, 1) == f"8 h100 {RESERVED_NOTE} (1 job)"
        assert RESERVED_NOTE == "reserved for jobs handed off and not yet running there"


class TestALaggingPeer:
    """Ticks one second apart, each after a fresh heartbeat of the peer."""

    def tick(self, tick: int, queue: list[Candidate], in_flight: list[InFlight], peer_state) -> list[str]:
        snapshot = PlacementSnapshot(tuple(queue), (peer_state,), (), NOW + tick, tuple(in_flight))
        result = place(snapshot, RULES)
        promoted = [p.job_id for p in result.promotions]
        for promotion in result.promotions:
            in_flight.append(InFlight(promotion.job_id, promotion.peer_id, promotion.backend_id, promotion.reserved))
        queue[:] = [c for c in queue if c.job_id not in promoted]
        return promoted

    def test_three_ticks_of_the_same_numbers_promote_one_job_not_three(self):
        queue = [job(f"/u/{i}", count=8, submitted=i) for i in range(3)]
        in_flight: list[InFlight] = []
        landed = [self.tick(t * 1000, queue, in_flight, lagging_peer(t * 1000)) for t in range(3)]
        assert landed == [["/u/0"], [], []]

    def test_once_the_job_runs_and_a_heartbeat_shows_it_the_capacity_is_offered_again_at_once(self):
        queue = [job(f"/u/{i}", count=8, submitted=i) for i in range(3)]
        in_flight: list[InFlight] = []
        assert self.tick(0, queue, in_flight, lagging_peer(0, free=16)) == ["/u/0", "/u/1"]
        assert self.tick(1000, queue, in_flight, lagging_peer(1000, free=16)) == []
        # /u/0 is reported running at 1500; the next heartbeat (asked at 2000) shows it holding 8.
        in_flight[0] = InFlight("/u/0", "cw", "default", H100_8, holding_since_ms=NOW + 1500)
        assert self.tick(2000, queue, in_flight, lagging_peer(2000, free=8, held=8)) == []  # /u/1 still reserves 8
        # /u/1 runs too: the next heartbeat shows both, and nothing is reserved any more.
        in_flight[1] = InFlight("/u/1", "cw", "default", H100_8, holding_since_ms=NOW + 2500)
        assert self.tick(3000, queue, in_flight, lagging_peer(3000, free=0, held=16)) == []
        # /u/0 ends: its 8 are offered to the next job on the very heartbeat that shows them free.
        del in_flight[0]
        assert self.tick(4000, queue, in_flight, lagging_peer(4000, free=8, held=8)) == ["/u/2"]

    def test_a_running_report_after_the_heartbeat_keeps_the_reservation_one_more_heartbeat(self):
        # Reported running after the numbers in use were asked for: they may not include it yet.
        queue = [job("/u/next", count=8)]
        in_flight = [InFlight("/u/0", "cw", "default", H100_8, holding_since_ms=NOW + 500)]
        assert self.tick(600, queue, in_flight, lagging_peer(0, free=8, observed_after=NOW + 100)) == []
        assert self.tick(1000, queue, in_flight, lagging_peer(1000, free=8, observed_after=NOW + 1000)) == ["/u/next"]

    def test_fifty_peers_under_a_long_queue_take_one_job_each_not_one_per_tick(self):
        peers = tuple(
            peer(f"p{i:02d}", gpu("default", "h100", 8, epoch=NOW + i), observed_after_ms=NOW) for i in range(50)
        )
        queue = [job(f"/u/{i:04d}", count=8, submitted=i) for i in range(500)]
        in_flight: list[InFlight] = []
        promoted = []
        for tick in range(5):
            fresh = tuple(peer(p.peer_id, *p.backends, observed_after_ms=NOW + tick) for p in peers)
            snapshot = PlacementSnapshot(tuple(queue), fresh, (), NOW + tick, tuple(in_flight))
            result = place(snapshot, RULES)
            promoted.append(len(result.promotions))
            in_flight += [InFlight(p.job_id, p.peer_id, p.backend_id, p.reserved) for p in result.promotions]
            done = {p.job_id for p in result.promotions}
            queue = [c for c in queue if c.job_id not in done]
        assert promoted == [50, 0, 0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=12),
    st.integers(0, 32),
    st.integers(1, 6),
)
def test_across_ticks_promotions_never_exceed_what_the_peer_offers_until_its_jobs_show(sizes, free, ticks):
    """However many ticks pass with the same numbers, what is promoted fits in one report's free capacity."""
    queue = [job(f"/u/{i:02d}", count=n, submitted=i) for i, n in enumerate(sizes)]
    in_flight: list[InFlight] = []
    for tick in range(ticks):
        state = lagging_peer(tick * 1000, free=free)
        snapshot = PlacementSnapshot(tuple(queue), (state,), (), NOW + tick * 1000, tuple(in_flight))
        result = place(snapshot, RULES)
        in_flight += [InFlight(p.job_id, p.peer_id, p.backend_id, p.reserved) for p in result.promotions]
        done = {p.job_id for p in result.promotions}
        queue = [c for c in queue if c.job_id not in done]
    assert sum(sum(j.gate.values()) for j in in_flight) <= free

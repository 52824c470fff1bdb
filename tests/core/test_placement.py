"""Placement scenarios: each rule of the pass, on a case small enough to reason about by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import plan
from tests.core.builders import NOW, backend, cpu_job, gpu, job, peer


def placed(result):
    return {p.job_id: (p.peer_id, p.backend_id) for p in result.promotions}


def test_gpu_job_lands_on_the_only_peer_with_enough_free_capacity():
    peers = [peer("a", gpu("default", "h100", 4)), peer("b", gpu("default", "h100", 8))]
    result = plan([job("/u/train", count=8)], peers, now_ms=NOW)
    assert placed(result) == {"/u/train": ("b", "default")}
    (promotion,) = result.promotions
    assert promotion.reserved == {"h100": 8}
    assert promotion.observation_epoch_ms == NOW - 10_000
    assert not promotion.preempts


def test_availability_is_never_summed_across_backends():
    peers = [peer("a", gpu("one", "h100", 6), gpu("two", "h100", 4))]
    result = plan([job("/u/train", count=8)], peers, now_ms=NOW)
    assert result.promotions == ()
    assert [(p.job_id, p.reason) for p in result.pending] == [("/u/train", reasons.QUEUED_UNPINNED)]


def test_the_gate_counts_every_replica():
    peers = [peer("a", gpu("default", "h100", 16))]
    result = plan([job("/u/big", count=8, replicas=3), job("/u/fits", count=8, replicas=2)], peers, now_ms=NOW)
    assert placed(result) == {"/u/fits": ("a", "default")}
    assert result.promotions[0].reserved == {"h100": 16}


def test_an_interactive_job_reclaims_batch_work_on_a_full_peer():
    # The reference's #7703: a peer full of batch work must still take an interactive job.
    peers = [peer("cw", gpu("default", "h100", 0, held={Band.BATCH: 360}))]
    result = plan([job("/u/batch", band="batch"), job("/u/chat", band="interactive")], peers, now_ms=NOW)
    assert placed(result) == {"/u/chat": ("cw", "default")}
    assert result.promotions[0].preempts
    assert [p.job_id for p in result.pending] == ["/u/batch"]


def test_reclaim_only_counts_strictly_lower_bands_by_rank():
    held = {Band.PRODUCTION: 8, Band.PRIORITY: 8, Band.INTERACTIVE: 8, Band.BATCH: 8}
    peers = [peer("cw", gpu("default", "h100", 0, held=held))]
    # PRIORITY sits between production and interactive: it can reach interactive + batch (16), no more.
    result = plan([job("/u/p", band="priority", count=17)], peers, now_ms=NOW)
    assert result.promotions == ()
    result = plan([job("/u/p", band="priority", count=16)], peers, now_ms=NOW)
    assert placed(result) == {"/u/p": ("cw", "default")}
    result = plan([job("/u/p", band="production", count=24)], peers, now_ms=NOW)
    assert placed(result) == {"/u/p": ("cw", "default")}


def test_reclaim_takes_the_lowest_band_first():
    held = {Band.INTERACTIVE: 8, Band.BATCH: 8}
    peers = [peer("cw", gpu("default", "h100", 0, held=held))]
    # Production takes its 8 from batch, not from interactive; so a later interactive job, which
    # may only reclaim batch, finds nothing left to take.
    jobs = [job("/u/prod", band="production", submitted=1), job("/u/chat", band="interactive", submitted=2)]
    result = plan(jobs, peers, now_ms=NOW)
    assert placed(result) == {"/u/prod": ("cw", "default")}
    remaining = result.remaining[("cw", "default")]
    assert remaining.held == [(Band.BATCH.rank, {"h100": 0}), (Band.INTERACTIVE.rank, {"h100": 8})]


def test_idle_capacity_beats_a_tighter_fit_that_would_preempt():
    peers = [
        peer("a", gpu("default", "h100", 0, held={Band.BATCH: 8})),  # fits exactly, by preemption
        peer("b", gpu("default", "h100", 16)),  # fits idle, looser
    ]
    result = plan([job("/u/chat", count=8)], peers, now_ms=NOW)
    assert placed(result) == {"/u/chat": ("b", "default")}


def test_tightest_fit_then_peer_id_then_backend_id():
    peers = [peer("b", gpu("x", "h100", 8), gpu("y", "h100", 8)), peer("a", gpu("z", "h100", 16))]
    result = plan([job("/u/one", count=8)], peers, now_ms=NOW)
    assert placed(result) == {"/u/one": ("b", "x")}
    peers = [peer("b", gpu("y", "h100", 8)), peer("a", gpu("z", "h100", 8))]
    assert placed(plan([job("/u/one", count=8)], peers, now_ms=NOW)) == {"/u/one": ("a", "z")}


def test_capacity_taken_in_a_pass_is_seen_by_the_next_candidate():
    peers = [peer("a", gpu("default", "h100", 12))]
    result = plan([job("/u/1", submitted=1), job("/u/2", submitted=2)], peers, now_ms=NOW)
    assert placed(result) == {"/u/1": ("a", "default")}


def test_no_head_of_line_blocking():
    peers = [peer("a", gpu("default", "h100", 8))]
    result = plan([job("/u/huge", count=64, submitted=1), job("/u/small", count=8, submitted=2)], peers, now_ms=NOW)
    assert placed(result) == {"/u/small": ("a", "default")}


def test_queue_order_is_band_rank_then_submit_time_then_job_id():
    peers = [peer("a", gpu("default", "h100", 8))]
    jobs = [
        job("/u/batch-early", band="batch", submitted=1),
        job("/u/inter-late", band="interactive", submitted=9),
        job("/u/b", band="production", submitted=5),
        job("/u/a", band="production", submitted=5),
    ]
    assert placed(plan(jobs, peers, now_ms=NOW)) == {"/u/a": ("a", "default")}


def test_a_capacity_reporting_backend_beats_a_shape_only_one_and_full_means_wait():
    peers = [peer("a", gpu("legacy", "h100", None)), peer("b", gpu("tracked", "h100", 8))]
    result = plan([job("/u/1", submitted=1), job("/u/2", submitted=2)], peers, now_ms=NOW)
    # The first goes where capacity is visible; the tracked backend is then full, so the second
    # goes to the shape-only backend (which never reserves anything).
    assert placed(result) == {"/u/1": ("b", "tracked"), "/u/2": ("a", "legacy")}
    assert result.promotions[1].reserved == {}
    assert result.promotions[1].observation_epoch_ms is None
    # With only a full tracked backend, the job waits rather than being force-routed.
    result = plan([job("/u/3", count=16)], [peer("b", gpu("tracked", "h100", 8))], now_ms=NOW)
    assert result.promotions == ()


def test_an_availability_block_of_a_newer_version_is_matched_on_shape_alone():
    peers = [peer("a", gpu("future", "h100", 0, version=3))]
    result = plan([job("/u/1", count=8)], peers, now_ms=NOW)
    assert placed(result) == {"/u/1": ("a", "future")}
    assert result.promotions[0].reserved == {}
    assert result.ledger == ()


def test_a_pinned_job_goes_only_to_its_peer_and_is_force_routed_there():
    peers = [peer("a", gpu("default", "h100", 64)), peer("b", backend("cpu-only", device_type="cpu"))]
    result = plan([job("/u/pinned", pin="b")], peers, now_ms=NOW)
    assert placed(result) == {"/u/pinned": ("b", "")}
    assert result.promotions[0].reserved == {}


def test_a_pinned_job_waits_for_its_peer_when_that_peer_is_full():
    peers = [peer("a", gpu("default", "h100", 64)), peer("b", gpu("default", "h100", 0))]
    result = plan([job("/u/pinned", pin="b")], peers, now_ms=NOW)
    assert result.promotions == ()
    assert [(p.job_id, p.reason) for p in result.pending] == [("/u/pinned", reasons.queued("b"))]
    assert result.pending[0].reason == "Queued for peer b to report free capacity"


def test_a_job_goes_to_the_next_best_peer_while_it_avoids_the_best_one():
    peers = [peer("a", gpu("default", "h100", 8)), peer("b", gpu("default", "h100", 16))]
    assert placed(plan([job("/u/one")], peers, now_ms=NOW)) == {"/u/one": ("a", "default")}
    avoiding = replace(job("/u/one"), avoided_peer_ids=frozenset({"a"}))
    assert placed(plan([avoiding], peers, now_ms=NOW)) == {"/u/one": ("b", "default")}
    # Another job of the same shape that avoids nothing still sees peer a.
    both = plan([avoiding, job("/u/two", submitted=1)], peers, now_ms=NOW)
    assert placed(both) == {"/u/one": ("b", "default"), "/u/two": ("a", "default")}


def test_a_job_that_avoids_every_matching_peer_waits_in_the_queue():
    peers = [peer("a", gpu("default", "h100", 8)), peer("b", backend("cpu", device_type="cpu"))]
    avoiding = replace(job("/u/one"), avoided_peer_ids=frozenset({"a"}))
    result = plan([avoiding], peers, now_ms=NOW)
    assert result.promotions == () and [p.reason for p in result.pending] == [reasons.QUEUED_UNPINNED]


def test_stale_and_unreachable_peers_are_not_used():
    peers = [
        peer("a", gpu("default", "h100", 8), last_contact_ms=NOW - 120_001),
        peer("b", gpu("default", "h100", 8), reachable=False),
        peer("c", gpu("default", "h100", 8), last_contact_ms=NOW - 120_000),
    ]
    assert placed(plan([job("/u/1")], peers, now_ms=NOW, staleness_ms=120_000)) == {"/u/1": ("c", "default")}


def test_the_per_peer_cap_bounds_promotions_in_one_pass():
    peers = [peer("a", backend("cpu", free={}, device_type="cpu"))]
    result = plan([cpu_job(f"/u/{i}", submitted=i) for i in range(5)], peers, now_ms=NOW, max_per_peer=3)
    assert len(result.promotions) == 3
    assert len(result.pending) == 2


def test_ungated_jobs_spread_across_peers_instead_of_piling_on_the_first():
    peers = [peer(name, backend("cpu", free={})) for name in ("a", "b", "c")]
    result = plan([cpu_job(f"/u/{i}", submitted=i) for i in range(6)], peers, now_ms=NOW)
    assert [p.peer_id for p in result.promotions] == ["a", "b", "c", "a", "b", "c"]


def test_ungated_spreading_lasts_across_ticks_by_counting_jobs_already_in_flight():
    """One job per tick: without the count, every one would land on the first peer."""
    peers = [peer(name, backend("cpu", free={})) for name in ("a", "b", "c")]
    in_flight: dict[str, int] = {}
    landed = []
    for tick in range(6):
        result = plan([cpu_job(f"/u/{tick}", submitted=tick)], peers, now_ms=NOW, active_jobs=in_flight)
        (promotion,) = result.promotions
        landed.append(promotion.peer_id)
        in_flight[promotion.peer_id] = in_flight.get(promotion.peer_id, 0) + 1
    assert landed == ["a", "b", "c", "a", "b", "c"]


def test_ungated_jobs_go_to_the_fewest_jobs_in_flight_plus_promotions_this_pass_ties_by_peer_id():
    peers = [peer(name, backend("cpu", free={})) for name in ("a", "b", "c")]
    result = plan([cpu_job(f"/u/{i}", submitted=i) for i in range(4)], peers, now_ms=NOW, active_jobs={"a": 3, "b": 1})
    # loads (a, b, c): (3, 1, 0) -> c; (3, 1, 1) -> b; (3, 2, 1) -> c; (3, 2, 2) -> b, the lower id of a tie
    assert [p.peer_id for p in result.promotions] == ["c", "b", "c", "b"]


def test_a_tracked_backend_still_beats_a_shape_only_one_whatever_the_load():
    peers = [peer("a", backend("cpu", free={})), peer("b", backend("cpu"))]
    result = plan([cpu_job("/u/0")], peers, now_ms=NOW, active_jobs={"a": 9})
    assert placed(result) == {"/u/0": ("a", "cpu")}


def mixed(backend_id: str, free: dict[str, int], held: dict[Band, dict[str, int]] | None = None):
    """A backend that runs CPU work and reports GPUs too (a Kubernetes cluster with a GPU pool)."""
    return backend(backend_id, free=free, held=held, device_type="gpu", device_variant=["h100", "a100"])


def test_a_coordinator_lands_where_what_it_prefers_has_the_most_room_before_the_spread():
    peers = [
        peer("a", mixed("k8s", {"h100": 0})),
        peer("b", mixed("k8s", {"h100": 16}, {Band.BATCH: {"h100": 8}})),  # 16 free + 8 it may reclaim
        peer("c", mixed("k8s", {"h100": 20})),
    ]
    coordinator = cpu_job("/u/coordinator", prefer=["h100"])
    result = plan([coordinator], peers, now_ms=NOW, active_jobs={"b": 5})
    assert placed(result) == {"/u/coordinator": ("b", "k8s")}  # 24 within its reach, busy or not
    (promotion,) = result.promotions
    assert promotion.reserved == {}  # a preference is never taken ...
    assert result.remaining[("b", "k8s")].free == {"h100": 16}  # ... nor spent in the pass
    assert result.ledger == ()
    # Without a preference the same job spreads: the idle peer with the lowest id.
    assert placed(plan([cpu_job("/u/coordinator")], peers, now_ms=NOW, active_jobs={"b": 5})) == {
        "/u/coordinator": ("a", "k8s")
    }


def test_the_room_a_job_prefers_is_what_its_band_may_reach():
    peers = [
        peer("b", mixed("k8s", {"h100": 8}, {Band.BATCH: {"h100": 16}})),
        peer("c", mixed("k8s", {"h100": 12})),
    ]
    # A batch job reclaims nothing from batch: 8 against 12.
    assert placed(plan([cpu_job("/u/c", band="batch", prefer=["h100"])], peers, now_ms=NOW)) == {"/u/c": ("c", "k8s")}
    # An interactive one reaches 8 + 16 on b.
    assert placed(plan([cpu_job("/u/c", prefer=["h100"])], peers, now_ms=NOW)) == {"/u/c": ("b", "k8s")}


def test_the_room_a_job_prefers_is_net_of_reservations_and_of_this_pass():
    peers = [peer("b", mixed("k8s", {"h100": 16})), peer("c", mixed("k8s", {"h100": 12}))]
    ledger = [LedgerEntry("b", "k8s", NOW - 10_000, {"h100": 8})]
    assert placed(plan([cpu_job("/u/c", prefer=["h100"])], peers, ledger, now_ms=NOW)) == {"/u/c": ("c", "k8s")}
    # A GPU job placed earlier in the same pass takes room the coordinator behind it would have had.
    peers = [peer("b", mixed("k8s", {"h100": 20})), peer("c", mixed("k8s", {"h100": 16}))]
    coordinator = cpu_job("/u/c", prefer=["h100"], submitted=2)
    assert placed(plan([coordinator], peers, now_ms=NOW)) == {"/u/c": ("b", "k8s")}
    jobs = [job("/u/train", count=8, pin="b", submitted=1), coordinator]
    assert placed(plan(jobs, peers, now_ms=NOW)) == {"/u/train": ("b", "k8s"), "/u/c": ("c", "k8s")}


def test_for_a_gated_job_the_preference_comes_after_the_tightest_fit_and_before_peer_id():
    peers = [
        peer("a", mixed("x", {"h100": 8, "a100": 0})),
        peer("b", mixed("y", {"h100": 8, "a100": 16})),
        peer("c", mixed("z", {"h100": 9, "a100": 64})),  # looser: never chosen for a tie-break
    ]
    assert placed(plan([job("/u/t", count=8, prefer=["a100"])], peers, now_ms=NOW)) == {"/u/t": ("b", "y")}
    assert placed(plan([job("/u/t", count=8)], peers, now_ms=NOW)) == {"/u/t": ("a", "x")}


def test_a_preference_for_something_nobody_reports_never_blocks_or_changes_a_placement():
    peers = [peer(name, backend("cpu", free={})) for name in ("a", "b")] + [peer("s", backend("cpu"))]
    plain = [cpu_job(f"/u/{i}", submitted=i) for i in range(5)]
    preferring = [cpu_job(f"/u/{i}", submitted=i, prefer=["zz9"]) for i in range(5)]
    assert placed(plan(preferring, peers, now_ms=NOW, max_per_peer=2)) == placed(
        plan(plain, peers, now_ms=NOW, max_per_peer=2)
    )
    assert len(placed(plan(preferring, peers, now_ms=NOW, max_per_peer=2))) == 5  # the fifth goes shape-only


def test_a_job_without_routing_constraints_is_force_routed_to_a_peer_without_backends():
    result = plan([cpu_job("/u/1")], [peer("bare")], now_ms=NOW)
    assert placed(result) == {"/u/1": ("bare", "")}


def test_jobs_past_their_deadline_expire_instead_of_being_placed():
    peers = [peer("a", gpu("default", "h100", 8))]
    result = plan([job("/u/late", deadline=NOW - 1), job("/u/ok", deadline=NOW)], peers, now_ms=NOW)
    assert result.expired == ("/u/late",)
    assert placed(result) == {"/u/ok": ("a", "default")}
    assert "/u/late" not in {p.job_id for p in result.pending}


class TestLedger:
    EPOCH = NOW - 10_000

    def test_reservations_at_the_current_observation_are_spent_first(self):
        peers = [peer("a", gpu("default", "h100", 8, epoch=self.EPOCH))]
        ledger = [LedgerEntry("a", "default", self.EPOCH, {"h100": 8})]
        result = plan([job("/u/1")], peers, ledger, now_ms=NOW)
        assert result.promotions == ()
        assert result.ledger == (LedgerEntry("a", "default", self.EPOCH, {"h100": 8}),)

    def test_a_strictly_newer_observation_resets_the_ledger(self):
        peers = [peer("a", gpu("default", "h100", 8, epoch=self.EPOCH + 1))]
        ledger = [LedgerEntry("a", "default", self.EPOCH, {"h100": 8})]
        result = plan([job("/u/1")], peers, ledger, now_ms=NOW)
        assert placed(result) == {"/u/1": ("a", "default")}
        assert result.ledger == (LedgerEntry("a", "default", self.EPOCH + 1, {"h100": 8}),)

    def test_an_older_observation_keeps_the_newer_reservation(self):
        # The peer's number is older than what was already spent: keep spending the reservation.
        peers = [peer("a", gpu("default", "h100", 16, epoch=self.EPOCH - 5))]
        ledger = [LedgerEntry("a", "default", self.EPOCH, {"h100": 8})]
        result = plan([job("/u/1"), job("/u/2", submitted=1)], peers, ledger, now_ms=NOW)
        assert [p.job_id for p in result.promotions] == ["/u/1"]
        assert result.ledger == (LedgerEntry("a", "default", self.EPOCH, {"h100": 16}),)

    def test_rows_for_absent_backends_are_dropped_and_rows_merge(self):
        peers = [peer("a", gpu("default", "h100", 0, epoch=self.EPOCH))]
        ledger = [
            LedgerEntry("gone", "default", self.EPOCH, {"h100": 8}),
            LedgerEntry("a", "default", self.EPOCH, {"h100": 2}),
            LedgerEntry("a", "default", self.EPOCH, {"h100": 3, "a100": 0}),
        ]
        result = plan([], peers, ledger, now_ms=NOW)
        assert result.ledger == (LedgerEntry("a", "default", self.EPOCH, {"h100": 5}),)

    def test_ticks_between_heartbeats_never_spend_more_than_one_observation(self):
        peers = [peer("a", gpu("default", "h100", 16, epoch=self.EPOCH))]
        ledger: tuple[LedgerEntry, ...] = ()
        landed = []
        for tick in range(5):
            result = plan([job(f"/u/{tick}")], peers, ledger, now_ms=NOW)
            ledger = result.ledger
            landed += [p.job_id for p in result.promotions]
        assert landed == ["/u/0", "/u/1"]


def test_max_per_peer_must_be_positive():
    with pytest.raises(ValueError, match="max_per_peer"):
        plan([], [], now_ms=NOW, max_per_peer=0)

"""The indexed placement pass against the plain reference scan, and its invariants, on random states."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core import ledger as ledger_math
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.placement import PlacementResult, plan
from tests.core.reference_placement import as_reference_shape, reference_plan
from tests.core.strategies import NOW, STALENESS, contended_states, states

PROFILE = settings(max_examples=400, deadline=None)


def run(state: dict, **overrides) -> PlacementResult:
    return plan(
        overrides.get("jobs", state["jobs"]),
        overrides.get("peers", state["peers"]),
        overrides.get("ledger", state["ledger"]),
        now_ms=NOW,
        max_per_peer=state["cap"],
        staleness_ms=STALENESS,
        **extras(state),
    )


def extras(state: dict) -> dict:
    return {
        "active_jobs": state["active"],
        "previous_holds": state["previous_holds"],
        "reserve_after_ms": state["reserve_after"],
    }


def reachable_backends(peers: list[PeerState]):
    return {
        (p.peer_id, b.backend_id): b for p in peers if p.is_reachable(NOW, STALENESS) for b in p.backends if b.tracked
    }


@PROFILE
@given(st.one_of(states(), contended_states()))
def test_the_indexed_pass_decides_exactly_as_the_reference_scan(state):
    expected = reference_plan(
        state["jobs"],
        state["peers"],
        state["ledger"],
        now_ms=NOW,
        max_per_peer=state["cap"],
        staleness_ms=STALENESS,
        **extras(state),
    )
    assert as_reference_shape(run(state)) == expected


@PROFILE
@given(states(), st.randoms(use_true_random=False))
def test_the_result_does_not_depend_on_input_order(state, rng: random.Random):
    jobs = list(state["jobs"])
    rng.shuffle(jobs)
    peers = [
        PeerState(p.peer_id, p.reachable, p.last_contact_ms, tuple(rng.sample(p.backends, len(p.backends))))
        for p in state["peers"]
    ]
    rng.shuffle(peers)
    ledger = list(state["ledger"])
    rng.shuffle(ledger)
    assert as_reference_shape(run(state, jobs=jobs, peers=peers, ledger=ledger)) == as_reference_shape(run(state))


@PROFILE
@given(states())
def test_every_job_is_promoted_pending_or_expired_exactly_once(state):
    result = run(state)
    ids = [p.job_id for p in result.promotions] + [p.job_id for p in result.pending] + list(result.expired)
    assert sorted(ids) == sorted(c.job_id for c in state["jobs"])


@PROFILE
@given(states())
def test_the_per_peer_cap_holds_pins_are_honoured_and_avoided_peers_skipped(state):
    result = run(state)
    assert all(n <= state["cap"] for n in Counter(p.peer_id for p in result.promotions).values())
    jobs = {c.job_id: c for c in state["jobs"]}
    for promotion in result.promotions:
        assert jobs[promotion.job_id].pinned_peer_id in ("", promotion.peer_id)
        assert promotion.peer_id not in jobs[promotion.job_id].avoided_peer_ids


@PROFILE
@given(states())
def test_each_promotion_fits_on_its_own_backend(state):
    """Never summed across backends: a gated job's whole gate fits one backend's free + reclaimable."""
    result = run(state)
    backends = reachable_backends(state["peers"])
    jobs = {c.job_id: c for c in state["jobs"]}
    for promotion in result.promotions:
        candidate = jobs[promotion.job_id]
        backend = backends.get((promotion.peer_id, promotion.backend_id))
        if backend is None:
            assert promotion.reserved == {}
            continue
        availability = backend.availability
        for token, need in candidate.gate:
            reachable = availability.amounts.get(token, 0) + sum(
                amounts.get(token, 0)
                for band, amounts in availability.held_by_band.items()
                if band.rank > candidate.band.rank
            )
            assert need <= reachable


@PROFILE
@given(states(), st.integers(1, 4))
def test_repeated_ticks_never_promote_more_than_one_observation_offers(state, ticks):
    """Per backend and observation: everything promoted across ticks fits its advertised free + held."""
    ledger = ()
    spent: Counter = Counter()
    remaining_jobs = list(state["jobs"])
    for _ in range(ticks):
        result = run(state, jobs=remaining_jobs, ledger=ledger)
        ledger = result.ledger
        promoted = {p.job_id for p in result.promotions}
        remaining_jobs = [c for c in remaining_jobs if c.job_id not in promoted]
        for p in result.promotions:
            for token, amount in p.reserved.items():
                spent[(p.peer_id, p.backend_id, token)] += amount
    for (peer_id, backend_id, token), amount in spent.items():
        availability = reachable_backends(state["peers"])[(peer_id, backend_id)].availability
        ceiling = availability.amounts.get(token, 0) + sum(a.get(token, 0) for a in availability.held_by_band.values())
        assert amount <= ceiling


@PROFILE
@given(states())
def test_the_output_ledger_carries_applicable_rows_and_this_pass_charges(state):
    result = run(state)
    applied = ledger_math.applicable(state["ledger"], state["peers"])
    for key, row in applied.items():
        out = {(r.peer_id, r.backend_id): r for r in result.ledger}
        for token, amount in row.reserved.items():
            if amount:
                assert out[key].reserved[token] >= amount
    assert [(r.peer_id, r.backend_id) for r in result.ledger] == sorted(
        (r.peer_id, r.backend_id) for r in result.ledger
    )
    assert all(all(v > 0 for v in r.reserved.values()) for r in result.ledger)


@PROFILE
@given(st.one_of(states(), contended_states()))
def test_holds_are_one_per_backend_and_job_for_eligible_jobs_left_queued(state):
    result = run(state)
    jobs = {c.job_id: c for c in state["jobs"]}
    pending = {p.job_id for p in result.pending}
    assert len({h.key for h in result.holds}) == len(result.holds)
    assert len({h.job_id for h in result.holds}) == len(result.holds)
    for hold in result.holds:
        candidate = jobs[hold.job_id]
        assert hold.job_id in pending and candidate.gate
        assert state["reserve_after"] and NOW - candidate.submitted_at_ms > state["reserve_after"]
        assert candidate.pinned_peer_id in ("", hold.peer_id) and hold.peer_id not in candidate.avoided_peer_ids
        backend = reachable_backends(state["peers"])[hold.key]
        totals = backend.availability.total_amounts
        assert all(token not in totals or totals[token] >= need for token, need in candidate.gate)
    if not state["reserve_after"]:
        assert result.holds == ()


@PROFILE
@given(st.one_of(states(), contended_states()))
def test_nothing_behind_a_holder_in_the_queue_is_promoted_onto_its_backend(state):
    result = run(state)
    jobs = {c.job_id: c for c in state["jobs"]}
    for hold in result.holds:
        holder = jobs[hold.job_id].queue_key()
        for promotion in result.promotions:
            if (promotion.peer_id, promotion.backend_id) == hold.key:
                assert jobs[promotion.job_id].queue_key() < holder

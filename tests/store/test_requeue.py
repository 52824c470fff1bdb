"""Requeue in the store: every move back to the queue is a conditional write, what it leaves behind
on the peer is remembered until that peer confirms, and stores created before it upgrade in place."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.records import HandoffRefusal
from iris_airflow_provider.store.schema import jobs
from iris_airflow_provider.store.store import FederationStore, RequeueOutcome
from tests.postgres import scratch_database
from tests.store.migrations import HEAD
from tests.store.test_store import NOW, promotion, queue


def pending(store: FederationStore, job_id: str = "/alice/train", peer: str = "cw") -> str:
    """A job promoted to ``peer`` and not delivered yet; returns its nonce."""
    nonce = queue(store, job_id).nonce
    assert store.promote(promotion(job_id, peer), NOW)
    return nonce


def requeue(store: FederationStore, nonce: str, *, peer: str = "cw", budget: int = 3, now: int = NOW + 10):
    refusal = HandoffRefusal("/alice/train", nonce, peer, "unavailable: connection refused", now + 1_000)
    return store.requeue_handoff(refusal, max_requeues=budget, now_ms=now)


def test_a_requeued_handoff_is_queued_again_avoiding_its_peer_and_remembered_there(store: FederationStore) -> None:
    nonce = pending(store)
    assert store.get_job("/alice/train").handoff_since_ms == NOW
    assert requeue(store, nonce) is RequeueOutcome.REQUEUED
    job = store.get_job("/alice/train")
    assert (job.handoff_state, job.state, job.peer_id, job.backend_id) == (
        HandoffState.QUEUED,
        JobState.PENDING,
        "",
        "",
    )
    assert (job.requeue_count, job.handoff_since_ms) == (1, None)
    assert job.nonce != nonce  # goes on as a new nonce: the old one may live on at the peer it left
    assert job.avoided_peers == {"cw": NOW + 1_010}
    assert job.last_delivery_error == "unavailable: connection refused" and job.delivery_attempts == 0
    assert [j.job_id for j in store.queued_jobs()] == ["/alice/train"]
    [left] = store.abandoned_handoffs()
    assert (left.peer_id, left.job_id, left.nonce) == ("cw", "/alice/train", nonce)
    assert store.events("/alice/train")[-1].detail == "requeue 1 of 3: unavailable: connection refused"
    # Said in the output the waiting task relays, too: its log says why the job is queued again.
    assert [line for _, line in store.log_lines("/alice/train")] == [
        "[iris-federation] Back in the queue: peer cw could not take the job (requeue 1 of 3: unavailable: "
        "connection refused); it avoids that peer for 1 s"
    ]


def test_avoidances_accumulate_and_expired_ones_are_dropped(store: FederationStore) -> None:
    def current_nonce() -> str:
        return store.get_job("/alice/train").nonce

    requeue(store, pending(store, peer="cw-a"), peer="cw-a", now=NOW + 10)
    assert store.promote(promotion(peer="cw-b"), NOW + 20)
    requeue(store, current_nonce(), peer="cw-b", now=NOW + 30)
    assert store.get_job("/alice/train").avoided_peers == {"cw-a": NOW + 1_010, "cw-b": NOW + 1_030}
    assert store.promote(promotion(peer="cw-c"), NOW + 1_020)
    requeue(store, current_nonce(), peer="cw-c", now=NOW + 1_020)  # cw-a's avoidance has ended by now
    job = store.get_job("/alice/train")
    assert job.avoided_peers == {"cw-b": NOW + 1_030, "cw-c": NOW + 2_020}
    assert job.avoided_peer_ids(NOW + 1_025) == ["cw-b", "cw-c"] and job.avoided_peer_ids(NOW + 1_030) == ["cw-c"]


def test_only_a_handoff_still_pending_on_that_peer_is_requeued(store: FederationStore) -> None:
    nonce = pending(store)
    assert requeue(store, "another-nonce") is RequeueOutcome.STALE
    assert requeue(store, nonce, peer="elsewhere") is RequeueOutcome.STALE
    assert store.mark_handed_off("/alice/train", nonce, NOW + 5)
    assert requeue(store, nonce) is RequeueOutcome.STALE  # the peer has it: it never moves
    cancelled = pending(store, "/alice/cancelled")
    store.request_cancel("/alice/cancelled", NOW + 5)
    refusal = HandoffRefusal("/alice/cancelled", cancelled, "cw", "x", 0)
    assert store.requeue_handoff(refusal, max_requeues=3, now_ms=NOW + 6) is RequeueOutcome.STALE
    assert store.abandoned_handoffs() == []
    assert store.get_job("/alice/train").handoff_state is HandoffState.HANDED_OFF


def test_the_requeue_after_the_budget_fails_the_job_for_good(store: FederationStore) -> None:
    nonce = pending(store)
    assert requeue(store, nonce, budget=0) is RequeueOutcome.EXHAUSTED
    job = store.get_job("/alice/train")
    assert (job.state, job.handoff_state) == (JobState.FAILED, HandoffState.REJECTED)
    assert job.error == (
        "No federation peer could take the job after 0 requeue(s); peer cw: unavailable: connection refused"
    )
    assert not store.promote(promotion(peer="cw-b"), NOW + 20)
    assert len(store.abandoned_handoffs()) == 1  # it may still be there: told to stop all the same


def test_promoting_back_onto_the_peer_it_left_delivers_a_new_nonce_there(store: FederationStore) -> None:
    nonce = pending(store)
    requeue(store, nonce)
    assert store.promote(promotion(peer="cw"), NOW + 2_000)
    job = store.get_job("/alice/train")
    assert (job.peer_id, job.handoff_state) == ("cw", HandoffState.PENDING) and job.nonce != nonce
    # What is to be terminated there is the old nonce only, never the one now being delivered.
    assert [h.nonce for h in store.abandoned_handoffs()] == [nonce]


def test_a_confirmed_abandoned_handoff_is_forgotten_with_an_event_when_it_was_stopped(store: FederationStore) -> None:
    nonce = pending(store)
    requeue(store, nonce)
    [left] = store.abandoned_handoffs()
    store.forget_abandoned(left, NOW + 20, terminated=True)
    store.forget_abandoned(left, NOW + 21, terminated=True)  # twice: one event
    assert store.abandoned_handoffs() == []
    assert [e.kind for e in store.events("/alice/train")].count("stray_terminated") == 1


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
    else:
        with scratch_database("iris_upgrade") as url:
            yield url


def test_a_store_created_before_requeue_upgrades_in_place_and_keeps_its_jobs(empty_url: str) -> None:
    store = FederationStore.from_url(empty_url)
    try:
        store.migrate("0001")
        with store.engine.begin() as connection:  # a job as the first release wrote it
            connection.execute(
                sa.text(
                    "INSERT INTO iris_jobs (job_id, direction, handoff_state, state, nonce, priority_band, "
                    "submitted_at_ms, spec, updated_at_ms) VALUES ('/alice/old', 'sent', 'pending', 'pending', "
                    "'n0', 'PRIORITY_BAND_BATCH', 1, :spec, 1)"
                ),
                {"spec": '{"job_id": "/alice/old", "command": "true"}'},
            )
        store.migrate()
        assert store.revision() == HEAD
        job = store.get_job("/alice/old")
        assert job is not None and job.direction is Direction.SENT
        # Its delivery clock starts from its last change, so it too is requeued if its peer stays away.
        assert (job.requeue_count, job.avoided_peers, job.handoff_since_ms) == (0, {}, 1)
        with store.engine.connect() as connection:
            assert connection.execute(sa.select(sa.func.count()).select_from(jobs)).scalar() == 1
    finally:
        store.dispose()


def test_a_store_with_a_ledger_upgrades_to_reservations_read_from_jobs_in_flight(empty_url: str) -> None:
    """0005: the ledger table goes; a job already running where it was sent is taken as holding there."""
    store = FederationStore.from_url(empty_url)
    try:
        store.migrate("0002")
        with store.engine.begin() as connection:
            for job_id, state in (("/alice/running", "running"), ("/alice/waiting", "pending")):
                connection.execute(
                    sa.text(
                        "INSERT INTO iris_jobs (job_id, direction, handoff_state, state, peer_id, backend_id, nonce, "
                        "priority_band, submitted_at_ms, spec, updated_at_ms) VALUES (:job_id, 'sent', 'handed_off', "
                        ":state, 'cw', 'default', :job_id, 'PRIORITY_BAND_BATCH', 1, :spec, 7)"
                    ),
                    {
                        "job_id": job_id,
                        "state": state,
                        "spec": json.dumps(
                            {"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}}}
                        ),
                    },
                )
            connection.execute(
                sa.text(
                    "INSERT INTO iris_reservation_ledger (peer_id, backend_id, token, observation_epoch_ms, amount) "
                    "VALUES ('cw', 'default', 'h100', 5, 8)"
                )
            )
        store.migrate()
        assert {(j.job_id, j.holding_since_ms) for j in store.in_flight_handoffs()} == {
            ("/alice/running", 7),
            ("/alice/waiting", None),
        }
        assert "iris_reservation_ledger" not in sa.inspect(store.engine).get_table_names()
        assert store.capacity_holds() == {}
    finally:
        store.dispose()

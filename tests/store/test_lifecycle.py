"""The lifecycle's writes in the store: the delivery claim, a handed-off outcome that lands after a
cancel or after the job moved on, a peer's "not found" settling a cancel only against the state it
was judged on, lost-peer settlements and withdrawals as compare-and-sets, the unreachable clock of a
peer, and stores created before this revision upgrading in place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.peer_loss import LostEnd, LostRequeue
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.records import HandoffRefusal, JobRecord
from iris_airflow_provider.store.store import FederationStore, RequeueOutcome
from tests.postgres import scratch_database
from tests.store.test_store import NOW, promotion, queue

JOB = "/alice/train"


def delivering(store: FederationStore, job_id: str = JOB) -> str:
    """A job promoted to ``cw`` whose delivery is in flight; returns its nonce."""
    nonce = queue(store, job_id).nonce
    assert store.promote(promotion(job_id), NOW)
    assert store.begin_delivery(job_id, nonce, NOW, stale_before_ms=NOW - 1)
    return nonce


def handed_off(store: FederationStore, job_id: str = JOB) -> JobRecord:
    nonce = delivering(store, job_id)
    assert store.mark_handed_off(job_id, nonce, NOW + 1, peer_id="cw")
    job = store.get_job(job_id)
    assert job is not None
    return job


def get(store: FederationStore, job_id: str = JOB) -> JobRecord:
    job = store.get_job(job_id)
    assert job is not None
    return job


class TestDeliveryClaim:
    def test_one_delivery_at_a_time_and_never_of_a_cancelled_job(self, store):
        nonce = delivering(store)
        assert not store.begin_delivery(JOB, nonce, NOW + 1, stale_before_ms=NOW - 1)  # held
        assert store.begin_delivery(JOB, nonce, NOW + 2, stale_before_ms=NOW)  # a dead tick's claim
        store.release_delivery(JOB, nonce)
        store.request_cancel(JOB, NOW + 3)
        assert not store.begin_delivery(JOB, nonce, NOW + 4, stale_before_ms=NOW)

    def test_a_handed_off_outcome_after_a_cancel_re_arms_it(self, store):
        nonce = delivering(store)
        store.request_cancel(JOB, NOW + 1)
        record = get(store)
        assert not record.terminal and record.delivery_claimed_at_ms == NOW
        # Even a confirmation recorded meanwhile is taken back: the peer now has what it did not have then.
        store.confirm_cancel(JOB, nonce, record.cancel_intent_version, NOW + 2)
        assert store.mark_handed_off(JOB, nonce, NOW + 3, peer_id="cw")
        job = get(store)
        assert (job.handoff_state, job.handed_off_at_ms, job.delivery_claimed_at_ms) == (
            HandoffState.HANDED_OFF,
            NOW + 3,
            None,
        )
        assert [j.job_id for j in store.pending_cancels()] == [JOB]
        assert store.events(JOB)[-1].detail == "while a cancel was requested: the cancel is routed to the peer"

    def test_an_incarnation_admitted_after_the_job_moved_on_is_terminated_there(self, store):
        nonce = delivering(store)
        store.release_delivery(JOB, nonce)
        store.defer_delivery(JOB, nonce, "timed out", NOW + 60_000, NOW + 1)
        record = get(store)
        decision = LostRequeue("Peer cw lost for 15 min; the job's state there is unknown")
        outcome = store.settle_lost(record, decision, now_ms=NOW + 2, avoid_until_ms=NOW + 100, max_requeues=3)
        assert outcome is RequeueOutcome.REQUEUED
        assert not store.mark_handed_off(JOB, nonce, NOW + 3, peer_id="cw")  # its answer lands late
        assert [(h.peer_id, h.nonce) for h in store.abandoned_handoffs()] == [("cw", nonce)]
        assert get(store).handoff_state is HandoffState.QUEUED

    def test_an_incarnation_admitted_after_the_job_ended_is_terminated_there(self, store):
        nonce = delivering(store)
        record = get(store)
        end = LostEnd(JobState.FAILED, "Peer cw lost for 15 min; the job's state there is unknown")
        assert store.settle_lost(record, end, now_ms=NOW + 1, avoid_until_ms=0, max_requeues=3) is JobState.FAILED
        store.forget_abandoned(store.abandoned_handoffs()[0], NOW + 2, terminated=False)  # "not found" earlier
        assert store.mark_handed_off(JOB, nonce, NOW + 3, peer_id="cw")
        assert [h.nonce for h in store.abandoned_handoffs()] == [nonce]
        assert get(store).state is JobState.FAILED

    def test_an_incarnation_admitted_after_its_requeue_budget_was_spent_is_terminated_there(self, store):
        nonce = delivering(store)
        refusal = HandoffRefusal(JOB, nonce, "cw", "unavailable: timed out", NOW + 100)
        assert store.requeue_handoff(refusal, max_requeues=0, now_ms=NOW + 1) is RequeueOutcome.EXHAUSTED
        store.forget_abandoned(store.abandoned_handoffs()[0], NOW + 2, terminated=False)  # "not found" earlier
        assert not store.mark_handed_off(JOB, nonce, NOW + 3, peer_id="cw")  # then its answer lands
        assert [h.nonce for h in store.abandoned_handoffs()] == [nonce]
        assert get(store).delivery_claimed_at_ms is None


class TestCancelAnswers:
    def test_not_found_settles_only_against_the_state_it_was_judged_on(self, store):
        nonce = delivering(store)
        store.request_cancel(JOB, NOW + 1)
        judged = get(store)  # read with the claim in place
        store.release_delivery(JOB, nonce)  # the delivery settled after the cancel was sent
        assert not store.cancel_never_had(judged, reasons.CANCELLED_BEFORE_HANDOFF, NOW + 2)
        assert not get(store).terminal
        rejudged = get(store)
        assert store.cancel_never_had(rejudged, reasons.CANCELLED_BEFORE_HANDOFF, NOW + 3)
        job = get(store)
        assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
        assert store.pending_cancels() == []

    def test_a_kill_of_a_cancelled_handoff_says_on_which_peer(self, store):
        job = handed_off(store)
        store.request_cancel(JOB, NOW + 2)
        report = JobReport(JOB, job.nonce, JobState.KILLED, "default", error="Cancelled")
        assert store.mirror(report, NOW + 3)
        assert get(store).error == "Cancelled on peer cw"


class TestLostPeers:
    def test_a_settlement_judged_on_a_stale_read_does_nothing(self, store):
        job = handed_off(store)
        store.mirror(JobReport(JOB, job.nonce, JobState.RUNNING, "default", started_at_ms=NOW + 2), NOW + 2)
        decision = LostRequeue("lost")  # judged when it had not started yet
        assert store.settle_lost(job, decision, now_ms=NOW + 3, avoid_until_ms=0, max_requeues=3) is None
        assert get(store).state is JobState.RUNNING and store.abandoned_handoffs() == []

    def test_a_running_job_requeued_starts_afresh(self, store):
        job = handed_off(store)
        store.mirror(JobReport(JOB, job.nonce, JobState.RUNNING, "default", started_at_ms=NOW + 2), NOW + 2)
        running = get(store)
        outcome = store.settle_lost(
            running, LostRequeue("lost"), now_ms=NOW + 3, avoid_until_ms=NOW + 99, max_requeues=3
        )
        assert outcome is RequeueOutcome.REQUEUED
        again = get(store)
        assert (again.state, again.started_at_ms, again.reported_at_ms, again.handed_off_at_ms) == (
            JobState.PENDING,
            None,
            None,
            None,
        )
        assert again.avoided_peers == {"cw": NOW + 99} and again.nonce != job.nonce

    def test_a_peer_is_unreachable_from_its_first_unanswered_heartbeat_until_it_answers(self, store):
        store.record_heartbeat("cw", NOW, None, error="down")
        store.record_heartbeat("cw", NOW + 10, None, error="down")
        assert [p.unreachable_since_ms for p in store.peers()] == [NOW]
        store.record_heartbeat("cw", NOW + 20, [])
        assert [p.unreachable_since_ms for p in store.peers()] == [None]


class TestWithdrawals:
    def test_only_an_admitted_unstarted_uncancelled_job_is_withdrawn_once(self, store):
        job = handed_off(store)
        assert store.begin_withdrawal(job, "not started", NOW + 2)
        assert not store.begin_withdrawal(job, "not started", NOW + 3)
        assert [j.job_id for j in store.withdrawals()] == [JOB]
        other = handed_off(store, "/alice/running")
        store.mirror(JobReport(other.job_id, other.nonce, JobState.RUNNING, "default"), NOW + 2)
        assert not store.begin_withdrawal(get(store, "/alice/running"), "not started", NOW + 3)

    def test_its_kill_is_the_withdrawals_to_record_but_a_finish_is_the_jobs(self, store):
        job = handed_off(store)
        store.begin_withdrawal(job, "not started", NOW + 2)
        assert not store.mirror(JobReport(JOB, job.nonce, JobState.KILLED, "default"), NOW + 3)
        assert store.finish_withdrawal(get(store), now_ms=NOW + 4, avoid_until_ms=0, max_requeues=3) is (
            RequeueOutcome.REQUEUED
        )
        other = handed_off(store, "/alice/quick")
        store.begin_withdrawal(other, "not started", NOW + 2)
        assert store.mirror(JobReport(other.job_id, other.nonce, JobState.SUCCEEDED, "default"), NOW + 3)
        assert get(store, "/alice/quick").state is JobState.SUCCEEDED

    def test_a_cancel_stops_a_withdrawal(self, store):
        job = handed_off(store)
        store.begin_withdrawal(job, "not started", NOW + 2)
        store.request_cancel(JOB, NOW + 3)
        assert get(store).withdraw_reason == ""
        stale = store.finish_withdrawal(job, now_ms=NOW + 4, avoid_until_ms=0, max_requeues=3)
        assert stale is RequeueOutcome.STALE


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
    else:
        with scratch_database("iris_upgrade_lifecycle") as url:
            yield url


def test_a_store_from_before_the_lifecycle_revision_upgrades_in_place(empty_url: str) -> None:
    store = FederationStore.from_url(empty_url)
    try:
        store.migrate("0006")
        with store.engine.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO iris_jobs (job_id, direction, handoff_state, state, nonce, priority_band, "
                    "submitted_at_ms, spec, updated_at_ms, handoff_since_ms) VALUES ('/alice/old', 'sent', "
                    "'handed_off', 'pending', 'n0', 'PRIORITY_BAND_BATCH', 1, :spec, 7, 5)"
                ),
                {"spec": '{"job_id": "/alice/old", "command": "true"}'},
            )
            connection.execute(
                sa.text(
                    "INSERT INTO iris_peers (peer_id, reachable, last_attempt_ms) VALUES ('cw', false, 42), "
                    "('up', true, 43)"
                )
            )
        store.migrate()
        job = store.get_job("/alice/old")
        assert job is not None and (job.handed_off_at_ms, job.withdraw_reason, job.delivery_claimed_at_ms) == (
            5,
            "",
            None,
        )
        assert {p.peer_id: p.unreachable_since_ms for p in store.peers()} == {"cw": 42, "up": None}
    finally:
        store.dispose()

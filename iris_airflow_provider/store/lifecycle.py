"""What ends or moves a handoff besides its delivery: a cancel the peer answered, a lost (or removed)
peer, and a job withdrawn from a peer that did not start it. Each is a conditional write on the
incarnation's nonce and the state its decision was made on, with its history event; the rules are
the core's (``cancel_settlement``, ``peer_loss``, ``start_timeout``)."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.peer_loss import LostDecision, LostEnd
from iris_airflow_provider.core.start_timeout import NOT_STARTED
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import StoreBase, event, not_terminal, notice, queued, set_terminal, touched
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.requeue import Departure, RequeueOutcome, abandon, lock_for_requeue, requeue_locked
from iris_airflow_provider.store.schema import jobs

LIVE_HANDOFFS = (HandoffState.PENDING.value, HandoffState.HANDED_OFF.value)


def _live_handoff() -> sa.ColumnElement[bool]:
    return sa.and_(jobs.c.direction == Direction.SENT.value, jobs.c.handoff_state.in_(LIVE_HANDOFFS), not_terminal())


def _not_started_on_peer() -> sa.ColumnElement[bool]:
    """Admitted by its peer and not started there, neither cancelled nor being withdrawn already."""
    return sa.and_(
        jobs.c.direction == Direction.SENT.value,
        jobs.c.handoff_state == HandoffState.HANDED_OFF.value,
        jobs.c.state.in_([s.value for s in NOT_STARTED]),
        jobs.c.started_at_ms.is_(None),
        jobs.c.cancel_intent_version == 0,
        jobs.c.withdraw_reason == "",
    )


class Lifecycle(StoreBase):
    def _records(self, *where: sa.ColumnElement[bool]) -> list[JobRecord]:
        with self._read() as connection:
            rows = connection.execute(sa.select(jobs).where(*where).order_by(jobs.c.submitted_at_ms)).mappings()
            return [JobRecord.from_row(row) for row in rows]

    # Cancels -----------------------------------------------------------------------------------

    def cancel_never_had(self, record: JobRecord, error: str, now_ms: int) -> bool:
        """The peer does not have incarnation ``record.nonce`` and no delivery can still bring it there
        (judged on ``record``, read before the cancel was sent): the cancel is confirmed and the job
        ends killed with ``error``. Applies only if the delivery claim and the handoff state are still
        as read; returns whether it did."""
        with self._write() as connection:
            confirmed = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == record.job_id,
                    jobs.c.nonce == record.nonce,
                    jobs.c.handoff_state == (record.handoff_state.value if record.handoff_state else None),
                    jobs.c.delivery_claimed_at_ms.is_not_distinct_from(record.delivery_claimed_at_ms),
                    jobs.c.cancel_delivered_version < record.cancel_intent_version,
                )
                .values(cancel_delivered_version=record.cancel_intent_version, **touched(now_ms))
            ).rowcount
            if confirmed:
                handoff, peer_id = record.handoff_state, record.peer_id
                set_terminal(connection, record.job_id, now_ms, JobState.KILLED, error, handoff, peer_id)
        return bool(confirmed)

    # Lost peers --------------------------------------------------------------------------------

    def live_handoff_peers(self) -> set[str]:
        """The peers live sent jobs name: handed off (or being delivered) there, or queued pinned to them."""
        query = (
            sa.select(jobs.c.peer_id)
            .distinct()
            .where(jobs.c.direction == Direction.SENT.value, jobs.c.peer_id != "", not_terminal())
        )
        with self._read() as connection:
            return {row[0] for row in connection.execute(query)}

    def handoffs_on(self, peer_ids: Iterable[str]) -> list[JobRecord]:
        """Live jobs handed off (or being delivered) to these peers."""
        return self._records(_live_handoff(), jobs.c.peer_id.in_(list(peer_ids)))

    def queued_pinned_to(self, peer_ids: Iterable[str]) -> list[JobRecord]:
        return self._records(queued(), jobs.c.peer_id.in_(list(peer_ids)))

    def settle_lost(
        self, record: JobRecord, decision: LostDecision, *, now_ms: int, avoid_until_ms: int, max_requeues: int
    ) -> RequeueOutcome | JobState | None:
        """Carry out what a lost peer means for ``record`` (unchanged since read): it ends (its state
        returned), or goes back to the queue (a requeue outcome). Either way the incarnation left on
        the peer is remembered there, to terminate by nonce if it answers again. None: the job changed
        since it was judged (it is judged again on the next tick)."""
        job_id, peer_id = record.job_id, record.peer_id
        with self._write() as connection:
            row = lock_for_requeue(
                connection,
                jobs.c.job_id == job_id,
                jobs.c.nonce == record.nonce,
                jobs.c.row_version == record.row_version,
                _live_handoff(),
            )
            if row is None:
                return None
            if isinstance(decision, LostEnd):
                abandon(connection, peer_id, job_id, record.nonce, decision.error, now_ms)
                connection.execute(
                    jobs.update()
                    .where(jobs.c.job_id == job_id)
                    .values(cancel_delivered_version=jobs.c.cancel_intent_version, withdraw_reason="")
                )
                event(connection, job_id, now_ms, "peer_lost", None, record.handoff_state, peer_id, decision.error)
                set_terminal(connection, job_id, now_ms, decision.state, decision.error, record.handoff_state, peer_id)
                text = f"{decision.error}. The incarnation left there is terminated if the peer answers again"
                notice(connection, job_id, record.nonce, text, now_ms)
                return decision.state
            event(connection, job_id, now_ms, "peer_lost", None, record.handoff_state, peer_id, decision.reason)
            how = f"peer {peer_id} was lost (the incarnation left there is terminated if it answers again)"
            departure = Departure(job_id, record.nonce, peer_id, decision.reason, avoid_until_ms, how)
            return requeue_locked(connection, departure, row, max_requeues=max_requeues, now_ms=now_ms)

    def fail_pinned_to_removed(self, record: JobRecord, now_ms: int) -> bool:
        """A queued job pinned to a peer no longer configured can never be placed: it ends unschedulable."""
        error = reasons.pinned_peer_removed(record.peer_id)
        with self._write() as connection:
            ended = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == record.job_id, jobs.c.nonce == record.nonce, jobs.c.peer_id == record.peer_id)
                .where(queued())
                .values(
                    state=JobState.UNSCHEDULABLE.value,
                    error=error,
                    finished_at_ms=now_ms,
                    cancel_delivered_version=jobs.c.cancel_intent_version,
                    **touched(now_ms),
                )
            ).rowcount
            if ended:
                event(
                    connection,
                    record.job_id,
                    now_ms,
                    "state",
                    JobState.UNSCHEDULABLE,
                    HandoffState.QUEUED,
                    record.peer_id,
                    error,
                )
        return bool(ended)

    # Start timeout -----------------------------------------------------------------------------

    def not_started_handoffs(self) -> list[JobRecord]:
        """Jobs their peer admitted and has not started, not being withdrawn or cancelled."""
        return self._records(_not_started_on_peer())

    def withdrawals(self) -> list[JobRecord]:
        """Jobs being withdrawn from their peer: to terminate there, then requeue."""
        return self._records(_live_handoff(), jobs.c.withdraw_reason != "")

    def begin_withdrawal(self, record: JobRecord, reason: str, now_ms: int) -> bool:
        """Start withdrawing ``record`` from its peer, if it is still admitted there, not started, not
        cancelled and not already being withdrawn. It is terminated there before it moves."""
        with self._write() as connection:
            begun = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == record.job_id, jobs.c.nonce == record.nonce, _not_started_on_peer())
                .values(withdraw_reason=reason, **touched(now_ms))
            ).rowcount
            if begun:
                event(
                    connection,
                    record.job_id,
                    now_ms,
                    "withdrawing",
                    None,
                    HandoffState.HANDED_OFF,
                    record.peer_id,
                    reason,
                )
                text = f"Withdrawing the job: {reason}; it is terminated there, then goes back to the queue"
                notice(connection, record.job_id, record.nonce, text, now_ms)
        return bool(begun)

    def finish_withdrawal(
        self, record: JobRecord, *, now_ms: int, avoid_until_ms: int, max_requeues: int
    ) -> RequeueOutcome:
        """The peer confirmed it no longer runs ``record``'s incarnation: back to the queue under a new
        nonce, avoiding that peer (nothing is left there to terminate)."""
        with self._write() as connection:
            row = lock_for_requeue(
                connection,
                jobs.c.job_id == record.job_id,
                jobs.c.nonce == record.nonce,
                jobs.c.withdraw_reason != "",
                jobs.c.cancel_intent_version == 0,
                _live_handoff(),
            )
            if row is None:
                return RequeueOutcome.STALE
            how = f"withdrawn from peer {record.peer_id}, which confirmed it stopped it"
            departure = Departure(
                record.job_id,
                record.nonce,
                record.peer_id,
                record.withdraw_reason,
                avoid_until_ms,
                how,
                left_behind=False,
            )
            return requeue_locked(connection, departure, row, max_requeues=max_requeues, now_ms=now_ms)

"""Handoffs: a queued job's way to a peer and back. Promotion (compare-and-set; the promoted job
then reserves its gate there while in flight, and holds no backend any more), delivery outcomes
(handed off, rejected, deferred, requeued), the incarnations a requeue leaves behind on a peer,
and what a job's runner reports (mirror, gone; a report that it holds capacity where it runs
lets the next heartbeat release its reservation)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.cancel_settlement import killed_error
from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.start_timeout import withdrawal_records
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import (
    StoreBase,
    event,
    not_terminal,
    notice,
    placeable,
    set_terminal,
    touched,
)
from iris_airflow_provider.store.holds import end_hold
from iris_airflow_provider.store.records import HandoffRefusal, JobRecord, replica_values
from iris_airflow_provider.store.requeue import Departure, RequeueOutcome, abandon, lock_for_requeue, requeue_locked
from iris_airflow_provider.store.results import record_result
from iris_airflow_provider.store.schema import abandoned_handoffs, jobs

# Reported states in which a job holds capacity where it runs (admitted there, or running).
HOLDING_STATES = frozenset({JobState.ACCEPTED, JobState.RUNNING})


@dataclass(frozen=True, slots=True)
class AbandonedHandoff:
    peer_id: str
    job_id: str
    nonce: str
    abandoned_at_ms: int
    reason: str


def _update_pending(
    connection: sa.Connection, job_id: str, nonce: str, now_ms: int, **values: Any
) -> tuple[str, int] | None:
    """Update this incarnation while its handoff is pending (promoted, not yet admitted by the peer):
    its (peer id, delivery attempts) after, or None when the handoff has moved on."""
    row = connection.execute(
        jobs.update()
        .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce, jobs.c.handoff_state == HandoffState.PENDING.value)
        .values(**values, **touched(now_ms))
        .returning(jobs.c.peer_id, jobs.c.delivery_attempts)
    ).first()
    return (row[0], row[1]) if row is not None else None


class Handoffs(StoreBase):
    # Promotion ---------------------------------------------------------------------------------

    def apply_promotions(self, promotions: Iterable[Promotion], now_ms: int) -> list[Promotion]:
        """Apply each promotion by compare-and-set; a confirmed one ends its job's hold."""
        confirmed = []
        with self._write() as connection:
            for promotion in promotions:
                if _promote(connection, promotion, now_ms):
                    confirmed.append(promotion)
                    end_hold(connection, promotion.job_id)
        return confirmed

    def promote(self, promotion: Promotion, now_ms: int) -> bool:
        return bool(self.apply_promotions([promotion], now_ms))

    # Delivery ----------------------------------------------------------------------------------

    def pending_handoffs(self, now_ms: int) -> list[JobRecord]:
        """Promoted jobs to deliver now: pending, uncancelled, not terminal, not backing off."""
        query = sa.select(jobs).where(
            jobs.c.direction == Direction.SENT.value,
            jobs.c.handoff_state == HandoffState.PENDING.value,
            jobs.c.cancel_intent_version == 0,
            not_terminal(),
            sa.or_(jobs.c.next_delivery_at_ms.is_(None), jobs.c.next_delivery_at_ms <= now_ms),
        )
        with self._read() as connection:
            rows = connection.execute(query.order_by(jobs.c.submitted_at_ms)).mappings()
            return [JobRecord.from_row(row) for row in rows]

    def mark_handed_off(self, job_id: str, nonce: str, now_ms: int, *, peer_id: str = "") -> bool:
        """The peer (``peer_id``) admitted this incarnation: the delivery's outcome, whenever it lands.

        It applies even if a cancel raced the delivery, and then re-arms that cancel: a "not found"
        the peer gave it meanwhile said nothing about a job that had not arrived yet, so the re-drive
        routes it to the peer again, which now has the job. An incarnation the job no longer wants
        (it ended, or went on under a new nonce) is remembered on ``peer_id``, to terminate it there.
        Returns whether the handoff moved to handed off.
        """
        with self._write() as connection:
            row = connection.execute(
                sa.select(
                    jobs.c.nonce,
                    jobs.c.state,
                    jobs.c.handoff_state,
                    jobs.c.peer_id,
                    jobs.c.cancel_intent_version,
                    jobs.c.cancel_delivered_version,
                )
                .where(jobs.c.job_id == job_id)
                .with_for_update()
            ).first()
            # Gone on without it (a new nonce), or given up on there (its requeue budget spent).
            unwanted = row is None or row.nonce != nonce or row.handoff_state == HandoffState.REJECTED.value
            if unwanted and peer_id:
                abandon(connection, peer_id, job_id, nonce, "admitted after the job went on without it", now_ms)
            this = jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
            if row is None or unwanted or row.handoff_state != HandoffState.PENDING.value:  # or its report came first
                connection.execute(this.values(delivery_claimed_at_ms=None))
                return False
            values: dict[str, Any] = {
                "handoff_state": HandoffState.HANDED_OFF.value,
                "handed_off_at_ms": now_ms,
                "delivery_claimed_at_ms": None,
                "last_delivery_error": "",
            }
            detail = ""
            if JobState(row.state).terminal:
                abandon(connection, row.peer_id, job_id, nonce, f"admitted after the job ended ({row.state})", now_ms)
                detail = "after the job ended: it is terminated there"
            elif row.cancel_intent_version:
                values["cancel_delivered_version"] = 0  # re-armed: the re-drive tells the peer, which has it now
                detail = "while a cancel was requested: the cancel is routed to the peer"
                notice(connection, job_id, nonce, f"Peer {row.peer_id} admitted the job {detail}", now_ms)
            connection.execute(this.values(**values, **touched(now_ms)))
            event(connection, job_id, now_ms, "handed_off", None, HandoffState.HANDED_OFF, row.peer_id, detail)
        return True

    def begin_delivery(self, job_id: str, nonce: str, now_ms: int, *, stale_before_ms: int) -> bool:
        """Claim the delivery of this incarnation before calling its peer: only a pending, uncancelled,
        live handoff that no other delivery holds (a claim from ``stale_before_ms`` or earlier is dead)."""
        with self._write() as connection:
            claimed = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    jobs.c.handoff_state == HandoffState.PENDING.value,
                    jobs.c.cancel_intent_version == 0,
                    not_terminal(),
                    sa.or_(jobs.c.delivery_claimed_at_ms.is_(None), jobs.c.delivery_claimed_at_ms <= stale_before_ms),
                )
                .values(delivery_claimed_at_ms=now_ms)
            ).rowcount
        return bool(claimed)

    def release_delivery(self, job_id: str, nonce: str) -> None:
        """The delivery of this incarnation has recorded its outcome (or failed): no longer in flight."""
        with self._write() as connection:
            connection.execute(
                jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce).values(delivery_claimed_at_ms=None)
            )

    def reject_handoff(self, job_id: str, nonce: str, message: str, now_ms: int) -> bool:
        """The peer refused this incarnation for good: the job ends with the peer's message."""
        with self._write() as connection:
            rejected = {"handoff_state": HandoffState.REJECTED.value, "last_delivery_error": message}
            row = _update_pending(connection, job_id, nonce, now_ms, **rejected)
            if row is None:
                return False
            peer_id = row[0]
            event(connection, job_id, now_ms, "rejected", None, HandoffState.REJECTED, peer_id, message)
            error = reasons.peer_rejected(peer_id, message)
            set_terminal(connection, job_id, now_ms, JobState.KILLED, error, HandoffState.REJECTED, peer_id)
        return True

    def defer_delivery(self, job_id: str, nonce: str, error: str, retry_at_ms: int, now_ms: int) -> bool:
        """A delivery failed in a way a retry may fix: count it and wait until ``retry_at_ms``."""
        with self._write() as connection:
            attempt = {"delivery_attempts": jobs.c.delivery_attempts + 1, "next_delivery_at_ms": retry_at_ms}
            row = _update_pending(connection, job_id, nonce, now_ms, last_delivery_error=error, **attempt)
            if row is None:
                return False
            detail = f"attempt {row[1]} failed (will retry): {error}"
            event(connection, job_id, now_ms, "delivery_failed", None, HandoffState.PENDING, row[0], detail)
        return True

    def requeue_handoff(self, refusal: HandoffRefusal, *, max_requeues: int, now_ms: int) -> RequeueOutcome:
        """Send a pending handoff that its peer could not take back to the queue, avoiding that peer
        until ``refusal.avoid_until_ms``; once the job has been requeued ``max_requeues`` times, fail it instead.

        Either way the peer is remembered as possibly holding this incarnation (an answer may have
        been lost), so it is told to terminate it there; a requeued job goes on under a new nonce.
        Only a handoff still pending on ``peer_id``, uncancelled and not terminal, moves (whether a
        pinned job may move at all is the caller's decision).
        """
        job_id, nonce, peer_id = refusal.job_id, refusal.nonce, refusal.peer_id
        with self._write() as connection:
            row = lock_for_requeue(
                connection,
                jobs.c.job_id == job_id,
                jobs.c.nonce == nonce,
                jobs.c.direction == Direction.SENT.value,
                jobs.c.handoff_state == HandoffState.PENDING.value,
                jobs.c.peer_id == peer_id,
                jobs.c.cancel_intent_version == 0,
                not_terminal(),
            )
            if row is None:
                return RequeueOutcome.STALE
            departure = Departure(job_id, nonce, peer_id, refusal.reason, refusal.avoid_until_ms)
            return requeue_locked(
                connection,
                departure,
                row,
                max_requeues=max_requeues,
                now_ms=now_ms,
                reject_when_exhausted=True,
                how=f"peer {peer_id} could not take the job",
            )

    def abandoned_handoffs(self) -> list[AbandonedHandoff]:
        """Incarnations to terminate on the peers that may hold them, oldest first."""
        query = sa.select(abandoned_handoffs).order_by(abandoned_handoffs.c.abandoned_at_ms)
        with self._read() as connection:
            return [AbandonedHandoff(**row) for row in connection.execute(query).mappings()]

    def forget_abandoned(self, handoff: AbandonedHandoff, now_ms: int, *, terminated: bool) -> None:
        """The peer confirmed it no longer runs that incarnation (``terminated``: it just stopped it)."""
        with self._write() as connection:
            deleted = connection.execute(
                abandoned_handoffs.delete().where(
                    abandoned_handoffs.c.peer_id == handoff.peer_id,
                    abandoned_handoffs.c.job_id == handoff.job_id,
                    abandoned_handoffs.c.nonce == handoff.nonce,
                )
            ).rowcount
            if deleted and terminated:
                detail = f"terminated the incarnation {handoff.nonce[:8]} left there ({handoff.reason})"
                event(connection, handoff.job_id, now_ms, "stray_terminated", None, None, handoff.peer_id, detail)
                current = connection.execute(sa.select(jobs.c.nonce).where(jobs.c.job_id == handoff.job_id)).first()
                if current is not None:  # told in the output of the job's current incarnation too
                    text = f"Peer {handoff.peer_id} answered again and {detail}"
                    notice(connection, handoff.job_id, current.nonce, text, now_ms)

    # What the job's runner reports -------------------------------------------------------------

    def mirror(self, report: JobReport, now_ms: int) -> bool:
        """Take what the job's runner (a peer, or a local backend) reports for incarnation ``report.nonce``.

        A report for a pending handoff also means the peer has it (handed off). Terminal jobs and
        other incarnations are left alone. Returns whether anything changed.
        """
        changed = sa.or_(
            jobs.c.state != report.state.value,
            jobs.c.reported_at_ms.is_(None),
            jobs.c.handoff_state == HandoffState.PENDING.value,
        )
        arriving = jobs.c.handoff_state == HandoffState.PENDING.value
        values: dict[str, Any] = {
            "state": report.state.value,
            "reported_at_ms": sa.func.coalesce(jobs.c.reported_at_ms, now_ms),
            "handoff_state": sa.case((arriving, HandoffState.HANDED_OFF.value), else_=jobs.c.handoff_state),
            # The peer has it: its "not found" is news again, and its start timeout runs from now.
            "delivery_claimed_at_ms": sa.case((arriving, None), else_=jobs.c.delivery_claimed_at_ms),
            "handed_off_at_ms": sa.case((arriving, now_ms), else_=jobs.c.handed_off_at_ms),
            **touched(now_ms),
        }
        if report.backend_id:
            values["backend_id"] = report.backend_id
        if report.replicas:  # a report without replicas (a peer that sends none) keeps what we had
            replicas = replica_values(report.replicas)
            values["replicas"] = replicas
            changed = sa.or_(changed, jobs.c.replicas != sa.literal(replicas, jobs.c.replicas.type))
        if report.state in HOLDING_STATES:  # it holds capacity there now: the next heartbeat shows it
            values["holding_since_ms"] = sa.func.coalesce(jobs.c.holding_since_ms, now_ms)
        if report.state.terminal:
            values.update(
                error=report.error, exit_code=report.exit_code, finished_at_ms=report.finished_at_ms or now_ms
            )
        if report.started_at_ms is not None:
            values["started_at_ms"] = sa.func.coalesce(jobs.c.started_at_ms, report.started_at_ms)
        withdrawal = sa.or_(jobs.c.withdraw_reason == "", sa.literal(not withdrawal_records(report.state)))
        with self._write() as connection:
            if report.state is JobState.KILLED:
                values["error"] = _killed_error(connection, report)
            row = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == report.job_id, jobs.c.nonce == report.nonce, not_terminal(), changed, withdrawal
                )
                .values(**values)
                .returning(jobs.c.handoff_state, jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            if report.state.terminal:
                result = report.result if report.state is JobState.SUCCEEDED else None
                record_result(connection, report.job_id, report.nonce, result, now_ms)
            event(connection, report.job_id, now_ms, "reported", report.state, row[0], row[1], report.error)
        return True

    def mark_gone(self, job_id: str, nonce: str, now_ms: int) -> bool:
        """The runner no longer has this incarnation: cancelled if we asked for it, else failed."""
        with self._write() as connection:
            row = connection.execute(
                sa.select(jobs.c.peer_id, jobs.c.cancel_intent_version, jobs.c.handoff_state, jobs.c.direction).where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    not_terminal(),
                    jobs.c.withdraw_reason == "",  # gone from a peer withdrawing it: the withdrawal goes on
                )
            ).first()
            if row is None:
                return False
            peer_id, intent, handoff, direction = row
            if intent:
                sent = direction == Direction.SENT.value
                state, error = JobState.KILLED, reasons.CANCELLED_PEER_GONE if sent else reasons.CANCELLED
            elif direction == Direction.SENT.value:
                state, error = JobState.FAILED, f"Peer {peer_id} no longer has the job"
            else:
                state, error = JobState.FAILED, "The local backend no longer has the job"
            return set_terminal(connection, job_id, now_ms, state, error, handoff, peer_id)


def _killed_error(connection: sa.Connection, report: JobReport) -> str:
    """The error of a job its runner reports killed (see ``killed_error``)."""
    row = connection.execute(
        sa.select(jobs.c.direction, jobs.c.cancel_intent_version, jobs.c.peer_id).where(jobs.c.job_id == report.job_id)
    ).first()
    if row is None:
        return report.error
    sent = row.direction == Direction.SENT.value
    return killed_error(
        sent=sent, cancel_requested=row.cancel_intent_version > 0, peer_id=row.peer_id, reported_error=report.error
    )


def _promote(connection: sa.Connection, promotion: Promotion, now_ms: int) -> bool:
    promoted = connection.execute(
        jobs.update()
        .where(
            jobs.c.job_id == promotion.job_id,
            placeable(),
            jobs.c.peer_id.in_(["", promotion.peer_id]),  # a pinned job only ever goes to its pin
        )
        .values(
            handoff_state=HandoffState.PENDING.value,
            peer_id=promotion.peer_id,
            backend_id=promotion.backend_id,
            handoff_since_ms=now_ms,
            **touched(now_ms),
        )
    ).rowcount
    if promoted:
        detail = f"backend {promotion.backend_id or '(force-routed)'}"
        if promotion.preempts:
            detail += ", reclaiming lower-band capacity"
        event(connection, promotion.job_id, now_ms, "promoted", None, HandoffState.PENDING, promotion.peer_id, detail)
    return bool(promoted)

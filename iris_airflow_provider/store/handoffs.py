"""Handoffs: a promoted job's way back from a peer that did not take it (rejected, deferred,
requeued), and the incarnations a requeue leaves behind on a peer. Promotion is :mod:`.promotions`,
the delivery claim and admission :mod:`.deliveries`, what the runner reports :mod:`.reports`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import (
    StoreBase,
    event,
    not_terminal,
    notice,
    set_terminal,
    touched,
)
from iris_airflow_provider.store.records import HandoffRefusal
from iris_airflow_provider.store.requeue import Departure, RequeueOutcome, lock_for_requeue, requeue_locked
from iris_airflow_provider.store.schema import abandoned_handoffs, jobs


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
    # Delivery outcomes -------------------------------------------------------------------------

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
            how = f"peer {peer_id} could not take the job"
            departure = Departure(job_id, nonce, peer_id, refusal.reason, refusal.avoid_until_ms, how, refused=True)
            return requeue_locked(connection, departure, row, max_requeues=max_requeues, now_ms=now_ms)

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

"""Back to the queue: a handoff leaves its peer and the job goes on under a new incarnation, avoiding
that peer for a while, within its requeue budget (once spent, the job fails instead).

Three things send a handoff back: a delivery its peer could not take, a lost peer, and a job
withdrawn for not starting. Each locks the row and checks its own condition first; the move itself
is here, with its history event and the notice its waiting task relays.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.common import event, insert, notice, set_terminal, supersede, touched
from iris_airflow_provider.store.schema import abandoned_handoffs, jobs


class RequeueOutcome(StrEnum):
    REQUEUED = "requeued"  # back in the queue, avoiding the peer for a while
    EXHAUSTED = "exhausted"  # its requeue budget was spent: the job failed
    STALE = "stale"  # the handoff had already moved on (delivered, cancelled, ended): nothing done


@dataclass(frozen=True, slots=True)
class Departure:
    """A handoff leaving ``peer_id``: why, until when the job avoids that peer, ``how`` it left as the
    job's output tells it, whether the peer may still hold the incarnation (then it is told to
    terminate it by nonce once it answers), and whether the peer refused it (then, once the requeue
    budget is spent, the handoff ends rejected)."""

    job_id: str
    nonce: str
    peer_id: str
    reason: str
    avoid_until_ms: int
    how: str
    left_behind: bool = True
    refused: bool = False


def abandon(connection: sa.Connection, peer_id: str, job_id: str, nonce: str, reason: str, now_ms: int) -> None:
    """Remember that ``peer_id`` may hold incarnation ``nonce`` of ``job_id``, to terminate it there."""
    connection.execute(
        insert(connection, abandoned_handoffs)
        .values(peer_id=peer_id, job_id=job_id, nonce=nonce, abandoned_at_ms=now_ms, reason=reason)
        .on_conflict_do_nothing()
    )


def lock_for_requeue(connection: sa.Connection, *conditions: sa.ColumnElement[bool]) -> sa.RowMapping | None:
    """The job row's requeue budget and avoided peers, locked until the transaction ends, if every
    one of ``conditions`` (the caller's compare-and-set on the row) still holds; else ``None``."""
    query = sa.select(jobs.c.requeue_count, jobs.c.avoided_peers).where(*conditions).with_for_update()
    return connection.execute(query).mappings().first()


def requeue_locked(
    connection: sa.Connection,
    departure: Departure,
    row: sa.RowMapping,
    *,
    max_requeues: int,
    now_ms: int,
) -> RequeueOutcome:
    """Requeue the job of ``departure`` (its row, read with ``requeue_count`` and ``avoided_peers``,
    locked by the caller)."""
    job_id, peer_id, reason = departure.job_id, departure.peer_id, departure.reason
    if departure.left_behind:
        abandon(connection, peer_id, job_id, departure.nonce, reason, now_ms)
    count = int(row["requeue_count"])
    locked = jobs.update().where(jobs.c.job_id == job_id)
    if count >= max_requeues:
        message = reasons.requeues_exhausted(count, peer_id, reason)
        handoff = HandoffState.REJECTED if departure.refused else None
        if handoff is not None:
            connection.execute(
                locked.values(handoff_state=handoff.value, last_delivery_error=reason, **touched(now_ms))
            )
            event(connection, job_id, now_ms, "rejected", None, handoff, peer_id, reason)
        set_terminal(connection, job_id, now_ms, JobState.FAILED, message, handoff, peer_id)
        return RequeueOutcome.EXHAUSTED
    avoided = {p: until for p, until in (row["avoided_peers"] or {}).items() if until > now_ms}
    avoided[peer_id] = max(departure.avoid_until_ms, avoided.get(peer_id, 0))
    # A new nonce: the peer it left may hold the old one (terminated there by that nonce), and a
    # later delivery must never be taken there for a replay of what was terminated.
    fresh_nonce = uuid.uuid4().hex
    supersede(connection, job_id, departure.nonce, now_ms)  # its output is pruned with the job's history
    connection.execute(
        locked.values(
            nonce=fresh_nonce,
            handoff_state=HandoffState.QUEUED.value,
            peer_id="",
            backend_id="",
            handoff_since_ms=None,
            handed_off_at_ms=None,
            delivery_claimed_at_ms=None,
            withdraw_reason="",
            state=JobState.PENDING.value,
            reported_at_ms=None,
            started_at_ms=None,
            log_cursor="",
            requeue_count=jobs.c.requeue_count + 1,
            avoided_peers=avoided,
            holding_since_ms=None,
            serving_urls=sa.null(),  # the new incarnation's peer mints its own
            delivery_attempts=0,
            next_delivery_at_ms=None,
            last_delivery_error=reason,
            **touched(now_ms),
        )
    )
    detail = f"requeue {count + 1} of {max_requeues}: {reason}"
    event(connection, job_id, now_ms, "requeued", None, HandoffState.QUEUED, peer_id, detail)
    avoid_s = max(0, departure.avoid_until_ms - now_ms) // 1000
    notice(
        connection,
        job_id,
        fresh_nonce,
        f"Back in the queue: {departure.how} ({detail}); it avoids that peer for {avoid_s} s",
        now_ms,
    )
    return RequeueOutcome.REQUEUED

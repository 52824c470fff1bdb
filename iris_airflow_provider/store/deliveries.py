"""Deliveries: the claim a tick takes on a pending handoff before calling its peer, and the peer's
admission of it (handed off), each for a batch of jobs at once.

Every change stays conditional on its own row: a claim only on a pending, uncancelled, live handoff
of that incarnation that no live claim holds; an admission only moves a handoff still pending under
that nonce (an unwanted or late one is remembered on the peer, to terminate it there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import (
    StoreBase,
    chunked,
    event_row,
    events,
    not_terminal,
    notice,
    touched,
)
from iris_airflow_provider.store.records import Admitted, JobRecord
from iris_airflow_provider.store.requeue import abandon
from iris_airflow_provider.store.schema import jobs


def _incarnations(items: Sequence[tuple[str, str]]) -> sa.ColumnElement[bool]:
    return sa.tuple_(jobs.c.job_id, jobs.c.nonce).in_(list(items))


class Deliveries(StoreBase):
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

    def begin_delivery(self, job_id: str, nonce: str, now_ms: int, *, stale_before_ms: int) -> bool:
        """Claim the delivery of this incarnation before calling its peer: only a pending, uncancelled,
        live handoff that no other delivery holds (a claim from ``stale_before_ms`` or earlier is dead)."""
        return job_id in self.begin_deliveries([(job_id, nonce)], now_ms, stale_before_ms=stale_before_ms)

    def begin_deliveries(
        self, incarnations: Sequence[tuple[str, str]], now_ms: int, *, stale_before_ms: int
    ) -> set[str]:
        """:meth:`begin_delivery` for each ``(job id, nonce)``, in one transaction; the ids claimed."""
        claimed: set[str] = set()
        if not incarnations:
            return claimed
        with self._write() as connection:
            for batch in chunked(incarnations):
                rows = connection.execute(
                    jobs.update()
                    .where(
                        _incarnations(batch),
                        jobs.c.handoff_state == HandoffState.PENDING.value,
                        jobs.c.cancel_intent_version == 0,
                        not_terminal(),
                        sa.or_(
                            jobs.c.delivery_claimed_at_ms.is_(None), jobs.c.delivery_claimed_at_ms <= stale_before_ms
                        ),
                    )
                    .values(delivery_claimed_at_ms=now_ms)
                    .returning(jobs.c.job_id)
                )
                claimed.update(row[0] for row in rows)
        return claimed

    def release_delivery(self, job_id: str, nonce: str) -> None:
        """The delivery of this incarnation has recorded its outcome (or failed): no longer in flight."""
        with self._write() as connection:
            connection.execute(
                jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce).values(delivery_claimed_at_ms=None)
            )

    def mark_handed_off(self, job_id: str, nonce: str, now_ms: int, *, peer_id: str = "") -> bool:
        """The peer (``peer_id``) admitted this incarnation: the delivery's outcome, whenever it lands.

        It applies even if a cancel raced the delivery, and then re-arms that cancel: a "not found"
        the peer gave it meanwhile said nothing about a job that had not arrived yet, so the re-drive
        routes it to the peer again, which now has the job. An incarnation the job no longer wants
        (it ended, or went on under a new nonce) is remembered on ``peer_id``, to terminate it there.
        Returns whether the handoff moved to handed off.
        """
        return job_id in self.mark_handed_off_many([Admitted(job_id, nonce, peer_id)], now_ms)

    def mark_handed_off_many(self, admitted: Sequence[Admitted], now_ms: int) -> set[str]:
        """:meth:`mark_handed_off` for each admission, in one transaction; the ids handed off. The
        common case (pending, live, uncancelled) is one update per batch; the rest row by row."""
        handed_off: set[str] = set()
        if not admitted:
            return handed_off
        with self._write() as connection:
            for batch in chunked(admitted):
                locked = connection.execute(
                    sa.select(
                        jobs.c.job_id,
                        jobs.c.nonce,
                        jobs.c.state,
                        jobs.c.handoff_state,
                        jobs.c.peer_id,
                        jobs.c.cancel_intent_version,
                    )
                    .where(jobs.c.job_id.in_([a.job_id for a in batch]))
                    .with_for_update()
                )
                rows = {row.job_id: row for row in locked}
                plain = []
                for admission in batch:
                    row = rows.get(admission.job_id)
                    if row is not None and _plain(row, admission):
                        plain.append((admission.job_id, admission.nonce))
                    elif _mark_locked(connection, row, admission, now_ms):
                        handed_off.add(admission.job_id)
                handed_off.update(_mark_plain(connection, plain, {j: rows[j].peer_id for j, _ in plain}, now_ms))
        return handed_off


HANDED_OFF: dict[str, Any] = {
    "handoff_state": HandoffState.HANDED_OFF.value,
    "delivery_claimed_at_ms": None,
    "last_delivery_error": "",
}


def _plain(row: Any, admission: Admitted) -> bool:
    """The common admission: this incarnation, still pending, live and uncancelled."""
    return (
        row.nonce == admission.nonce
        and row.handoff_state == HandoffState.PENDING.value
        and not JobState(row.state).terminal
        and not row.cancel_intent_version
    )


def _mark_plain(
    connection: sa.Connection, plain: Sequence[tuple[str, str]], peers: dict[str, str], now_ms: int
) -> list[str]:
    """Hand off the plain admissions (their rows locked): one update, one insert of their events."""
    if not plain:
        return []
    rows = connection.execute(
        jobs.update()
        .where(_incarnations(plain), jobs.c.handoff_state == HandoffState.PENDING.value)
        .values(**HANDED_OFF, handed_off_at_ms=now_ms, **touched(now_ms))
        .returning(jobs.c.job_id)
    )
    moved = {row[0] for row in rows}
    done = [job_id for job_id, _ in plain if job_id in moved]
    events(connection, [event_row(j, now_ms, "handed_off", None, HandoffState.HANDED_OFF, peers[j]) for j in done])
    return done


def _mark_locked(connection: sa.Connection, row: Any, admission: Admitted, now_ms: int) -> bool:
    """:meth:`Deliveries.mark_handed_off` on the job's locked ``row`` (None: the job is gone)."""
    job_id, nonce, peer_id = admission.job_id, admission.nonce, admission.peer_id
    # Gone on without it (a new nonce), or given up on there (its requeue budget spent).
    unwanted = row is None or row.nonce != nonce or row.handoff_state == HandoffState.REJECTED.value
    if unwanted and peer_id:
        abandon(connection, peer_id, job_id, nonce, "admitted after the job went on without it", now_ms)
    this = jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
    if row is None or unwanted or row.handoff_state != HandoffState.PENDING.value:  # or its report came first
        connection.execute(this.values(delivery_claimed_at_ms=None))
        return False
    values: dict[str, Any] = {**HANDED_OFF, "handed_off_at_ms": now_ms}
    detail = ""
    if JobState(row.state).terminal:
        abandon(connection, row.peer_id, job_id, nonce, f"admitted after the job ended ({row.state})", now_ms)
        detail = "after the job ended: it is terminated there"
    elif row.cancel_intent_version:
        values["cancel_delivered_version"] = 0  # re-armed: the re-drive tells the peer, which has it now
        detail = "while a cancel was requested: the cancel is routed to the peer"
        notice(connection, job_id, nonce, f"Peer {row.peer_id} admitted the job {detail}", now_ms)
    connection.execute(this.values(**values, **touched(now_ms)))
    events(connection, [event_row(job_id, now_ms, "handed_off", None, HandoffState.HANDED_OFF, row.peer_id, detail)])
    return True

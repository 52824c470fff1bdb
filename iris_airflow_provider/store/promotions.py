"""Promotion: a placement pass's decisions applied by compare-and-set, a batch of jobs per statement.

Each row keeps its own condition (still queued, uncancelled, not terminal, and a pinned job only to
its pin), so only the jobs whose condition held are promoted: a cancel racing the tick wins, and
the pass's decision for a job that lost its race is simply not applied. A promoted job then
reserves its gate on its peer while in flight, and holds no backend any more (its hold ends in the
promotion's transaction).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import HandoffState
from iris_airflow_provider.store.common import StoreBase, chunked, event_row, events, placeable, touched
from iris_airflow_provider.store.holds import end_holds
from iris_airflow_provider.store.schema import jobs


class Promotions(StoreBase):
    def apply_promotions(self, promotions: Iterable[Promotion], now_ms: int) -> list[Promotion]:
        """Apply each promotion by compare-and-set; returns those confirmed, in their order. A job
        is promoted once: a later promotion of the same job in ``promotions`` is ignored."""
        wanted: dict[str, Promotion] = {}
        for promotion in promotions:
            wanted.setdefault(promotion.job_id, promotion)
        if not wanted:
            return []
        promoted: set[str] = set()
        with self._write() as connection:
            for batch in chunked(list(wanted.values())):
                promoted.update(_promote(connection, batch, now_ms))
            confirmed = [promotion for promotion in wanted.values() if promotion.job_id in promoted]
            events(connection, [_promoted_event(promotion, now_ms) for promotion in confirmed])
            end_holds(connection, [promotion.job_id for promotion in confirmed])
        return confirmed

    def promote(self, promotion: Promotion, now_ms: int) -> bool:
        return bool(self.apply_promotions([promotion], now_ms))


def _promote(connection: sa.Connection, batch: Iterable[Promotion], now_ms: int) -> list[str]:
    """One compare-and-set over ``batch``: the ids of the jobs promoted (each row to its own peer and
    backend, looked up by job id in the statement)."""
    batch = list(batch)
    peer = sa.case({p.job_id: p.peer_id for p in batch}, value=jobs.c.job_id)
    backend = sa.case({p.job_id: p.backend_id for p in batch}, value=jobs.c.job_id)
    rows = connection.execute(
        jobs.update()
        .where(
            jobs.c.job_id.in_([p.job_id for p in batch]),
            placeable(),
            sa.or_(jobs.c.peer_id == "", jobs.c.peer_id == peer),  # a pinned job only ever goes to its pin
        )
        .values(
            handoff_state=HandoffState.PENDING.value,
            peer_id=peer,
            backend_id=backend,
            handoff_since_ms=now_ms,
            **touched(now_ms),
        )
        .returning(jobs.c.job_id)
    )
    return [row[0] for row in rows]


def _promoted_event(promotion: Promotion, now_ms: int) -> dict[str, object]:
    detail = f"backend {promotion.backend_id or '(force-routed)'}"
    if promotion.preempts:
        detail += ", reclaiming lower-band capacity"
    return event_row(promotion.job_id, now_ms, "promoted", None, HandoffState.PENDING, promotion.peer_id, detail)

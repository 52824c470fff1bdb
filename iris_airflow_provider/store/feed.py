"""What peers read from us and we read from them: on the peer side, the jobs a requester handed
us and which of them changed since its cursor; on the requester side, each peer's sync cursor."""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from iris_airflow_provider.core.ownership import received_job_key
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.schema import job_events, jobs, peer_sync


class Feed(StoreBase):
    def received_jobs(self, requester: str) -> list[JobRecord]:
        query = sa.select(jobs).where(jobs.c.direction == Direction.RECEIVED.value, jobs.c.peer_id == requester)
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query.order_by(jobs.c.job_id)).mappings()]

    def received_changes(self, requester: str, *, after_seq: int, limit: int = 10_000) -> list[tuple[str, int]]:
        """Jobs received from ``requester`` (those in its namespace, whatever became of them) with history
        events after ``after_seq``, as (job key, seq of its newest event), oldest change first."""
        query = (
            sa.select(job_events.c.job_id, sa.func.max(job_events.c.seq).label("last"))
            .where(
                job_events.c.seq > after_seq,
                job_events.c.job_id.startswith(received_job_key(requester, ""), autoescape=True),
            )
            .group_by(job_events.c.job_id)
            .order_by(sa.text("last"))
            .limit(limit)
        )
        with self._read() as connection:
            return [(row[0], row[1]) for row in connection.execute(query)]

    def sync_cursor(self, peer_id: str) -> str:
        with self._read() as connection:
            cursor = connection.execute(sa.select(peer_sync.c.cursor).where(peer_sync.c.peer_id == peer_id)).scalar()
        return cursor or ""

    def save_sync_cursor(self, peer_id: str, cursor: str, now_ms: int) -> None:
        values = {"cursor": cursor, "synced_at_ms": now_ms}
        with self._write() as connection:
            connection.execute(
                insert(connection, peer_sync)
                .values(peer_id=peer_id, **values)
                .on_conflict_do_update(index_elements=["peer_id"], set_=values)
            )

    def save_sync_cursors(self, cursors: Mapping[str, str], now_ms: int) -> None:
        """:meth:`save_sync_cursor` for each peer (peer id -> cursor), in one statement."""
        if not cursors:
            return
        rows = [{"peer_id": peer_id, "cursor": cursor, "synced_at_ms": now_ms} for peer_id, cursor in cursors.items()]
        with self._write() as connection:
            upsert = insert(connection, peer_sync).values(rows)
            new = upsert.excluded
            connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=["peer_id"], set_={"cursor": new.cursor, "synced_at_ms": new.synced_at_ms}
                )
            )

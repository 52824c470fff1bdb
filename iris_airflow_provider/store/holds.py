"""Backends held for starving jobs, as the last placement pass left them (see core/holds.py).

The pass decides anew every tick from the holds of the last one (a hold stays on its backend while
it still may); the store keeps them between ticks. Saving is conditional: a hold is only written
for a job still queued and uncancelled, so a promotion or a cancel racing the tick never leaves a
hold behind; each backend holds for one job at most (a unique key), and a promotion ends its job's
hold in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from iris_airflow_provider.core.holds import Hold
from iris_airflow_provider.core.ledger import BackendKey
from iris_airflow_provider.store.common import StoreBase, chunked, insert, placeable
from iris_airflow_provider.store.schema import capacity_holds, jobs


class Holds(StoreBase):
    def capacity_holds(self) -> dict[str, BackendKey]:
        """The backend each job held after the last pass, by job id."""
        query = sa.select(capacity_holds.c.job_id, capacity_holds.c.peer_id, capacity_holds.c.backend_id)
        with self._read() as connection:
            return {job_id: (peer_id, backend_id) for job_id, peer_id, backend_id in connection.execute(query)}

    def save_holds(self, holds: Iterable[Hold], now_ms: int) -> dict[str, BackendKey]:
        """Replace the holds by ``holds`` (a pass's) and return them as saved: a hold whose job is no
        longer queued (promoted, cancelled or ended since the pass read it) is left out, and one kept
        on the same backend keeps its ``held_since_ms``."""
        holds = list(holds)
        with self._write() as connection:
            wanted = sa.tuple_(capacity_holds.c.job_id, capacity_holds.c.peer_id, capacity_holds.c.backend_id).in_(
                [(h.job_id, h.peer_id, h.backend_id) for h in holds]
            )
            gone = ~sa.select(jobs.c.job_id).where(jobs.c.job_id == capacity_holds.c.job_id, placeable()).exists()
            connection.execute(capacity_holds.delete().where(sa.or_(~wanted, gone) if holds else sa.true()))
            # Only jobs still queued and uncancelled keep a hold: read in one statement per batch,
            # then inserted in one; a hold kept as it was, or whose backend (a racing tick's) is
            # taken, is left as it is.
            queued_ids: set[str] = set()
            for batch in chunked([hold.job_id for hold in holds]):
                still_queued = sa.select(jobs.c.job_id).where(jobs.c.job_id.in_(batch), placeable())
                queued_ids.update(connection.execute(still_queued).scalars())
            rows = [
                {"job_id": h.job_id, "peer_id": h.peer_id, "backend_id": h.backend_id, "held_since_ms": now_ms}
                for h in holds
                if h.job_id in queued_ids
            ]
            if rows:
                connection.execute(insert(connection, capacity_holds).on_conflict_do_nothing(), rows)
        return self.capacity_holds()


def end_holds(connection: sa.Connection, job_ids: Sequence[str]) -> None:
    """Promoted jobs hold nothing any more (in the promotion's transaction)."""
    for batch in chunked(job_ids):
        connection.execute(capacity_holds.delete().where(capacity_holds.c.job_id.in_(batch)))

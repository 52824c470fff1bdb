"""Job results: what an incarnation handed back at ``$IRIS_RESULT`` (see ``core/job_result.py``).

Written with the report that ends the incarnation (``Handoffs.mirror``, same transaction), read
by nonce: a rerun's new incarnation shows no result until it ends with its own, and reading again
(a retry after a lost answer, a reattaching task) returns the same one.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.schema import job_results


class Results(StoreBase):
    def job_result(self, job_id: str, nonce: str) -> str | None:
        """The result incarnation ``nonce`` of ``job_id`` handed back (JSON text), or None."""
        return self.job_results({job_id: nonce}).get(job_id)

    def job_results(self, incarnations: Mapping[str, str]) -> dict[str, str]:
        """The results of these incarnations (job id -> nonce) that handed one back, by job id."""
        if not incarnations:
            return {}
        query = sa.select(job_results.c.job_id, job_results.c.nonce, job_results.c.result).where(
            job_results.c.job_id.in_(list(incarnations))
        )
        with self._read() as connection:
            return {
                row.job_id: row.result for row in connection.execute(query) if incarnations[row.job_id] == row.nonce
            }


def record_result(connection: sa.Connection, job_id: str, nonce: str, result: str | None, now_ms: int) -> None:
    """Incarnation ``nonce`` ended handing back ``result`` (None: nothing): it replaces whatever an
    earlier incarnation handed back."""
    if result is None:
        connection.execute(job_results.delete().where(job_results.c.job_id == job_id))
        return
    values = {"nonce": nonce, "result": result, "recorded_at_ms": now_ms}
    connection.execute(
        insert(connection, job_results)
        .values(job_id=job_id, **values)
        .on_conflict_do_update(index_elements=["job_id"], set_=values)
    )

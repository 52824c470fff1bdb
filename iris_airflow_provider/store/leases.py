"""Leases: named locks that expire, so one holder at a time does a job (taken and renewed atomically)."""

from __future__ import annotations

from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.schema import leases


class Leases(StoreBase):
    def acquire_lease(self, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool:
        """Take or renew ``name`` for ``holder`` unless someone else holds it unexpired."""
        values = {"holder": holder, "expires_at_ms": now_ms + ttl_ms}
        with self._write() as connection:
            statement = (
                insert(connection, leases)
                .values(name=name, **values)
                .on_conflict_do_update(
                    index_elements=["name"],
                    set_=values,
                    where=(leases.c.holder == holder) | (leases.c.expires_at_ms <= now_ms),
                )
            )
            return connection.execute(statement.returning(leases.c.name)).first() is not None

    def release_lease(self, name: str, holder: str) -> None:
        with self._write() as connection:
            connection.execute(leases.delete().where(leases.c.name == name, leases.c.holder == holder))

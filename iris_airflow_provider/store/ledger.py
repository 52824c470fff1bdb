"""The reservation ledger as stored: one row per (peer, backend, token), read as core
:class:`~iris_airflow_provider.core.ledger.LedgerEntry` values, charged by the core rule
(:func:`~iris_airflow_provider.core.ledger.charged`) on the row read locked, and pruned once a
newer observation supersedes a row."""

from __future__ import annotations

import sqlalchemy as sa

from iris_airflow_provider.core.ledger import LedgerEntry, charged
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.schema import ledger, peer_backends


class Ledger(StoreBase):
    def ledger(self) -> list[LedgerEntry]:
        with self._read() as connection:
            rows = connection.execute(sa.select(ledger)).mappings().all()
        grouped: dict[tuple[str, str, int], dict[str, int]] = {}
        for row in rows:
            key = (row["peer_id"], row["backend_id"], row["observation_epoch_ms"])
            grouped.setdefault(key, {})[row["token"]] = row["amount"]
        return [LedgerEntry(p, b, epoch, amounts) for (p, b, epoch), amounts in sorted(grouped.items())]

    def prune_ledger(self) -> int:
        """Drop rows a strictly newer observation has superseded, or whose backend reports no capacity."""
        current = peer_backends.alias("current")
        still_applies = (
            sa.select(sa.literal(1))
            .where(
                current.c.peer_id == ledger.c.peer_id,
                current.c.backend_id == ledger.c.backend_id,
                current.c.observation_epoch_ms.is_not(None),
                current.c.observation_epoch_ms <= ledger.c.observation_epoch_ms,
            )
            .exists()
        )
        with self._write() as connection:
            pruned: int = connection.execute(ledger.delete().where(~still_applies)).rowcount
            return pruned


def charge_ledger(connection: sa.Connection, promotion: Promotion) -> None:
    """Charge a confirmed promotion's reservation, token by token, in the promotion's transaction."""
    if promotion.observation_epoch_ms is None:
        return  # shape-only backend: nothing advertised, nothing to reserve
    for token, amount in promotion.reserved.items():
        _charge_row(connection, promotion, token, promotion.observation_epoch_ms, amount)


def _charge_row(connection: sa.Connection, promotion: Promotion, token: str, observation: int, amount: int) -> None:
    """Read the row locked (PostgreSQL; SQLite's writers are serialized already), apply the core
    rule, and write the result. A second round happens only when another transaction inserted the
    row first: the locked read then waits for it and sees its amount."""
    key = (promotion.peer_id, promotion.backend_id)
    this_row = (ledger.c.peer_id == key[0], ledger.c.backend_id == key[1], ledger.c.token == token)
    for _ in range(2):
        held = connection.execute(
            sa.select(ledger.c.observation_epoch_ms, ledger.c.amount).where(*this_row).with_for_update()
        ).first()
        before = LedgerEntry(key[0], key[1], held[0], {token: held[1]}) if held is not None else None
        after = charged(before, key, observation, {token: amount})
        values = {"observation_epoch_ms": after.observation_epoch_ms, "amount": after.reserved[token]}
        if held is not None:
            connection.execute(ledger.update().where(*this_row).values(**values))
            return
        inserted = connection.execute(
            insert(connection, ledger)
            .values(peer_id=key[0], backend_id=key[1], token=token, **values)
            .on_conflict_do_nothing()
            .returning(ledger.c.token)
        ).first()
        if inserted is not None:
            return
    raise RuntimeError(f"the ledger row of {key[0]}/{key[1]} ({token}) was inserted and then lost")

"""Peer tokens already used here: each ``jti`` is remembered until its token can no longer be
accepted, so a captured token cannot be replayed, even to another api-server on this store.

Recording a token is one conditional insert (``ON CONFLICT DO NOTHING``): of two requests
carrying the same token, on one api-server or two, exactly one inserts it. Each insert also
prunes a bounded batch of expired entries, and a peer with too many live entries is refused a
new one, so the table stays bounded however fast a peer calls.
"""

from __future__ import annotations

from enum import StrEnum

import sqlalchemy as sa

from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.schema import seen_tokens

PRUNE_BATCH = 1_000  # expired entries deleted per insert: far more than the one each insert adds


class TokenUse(StrEnum):
    FIRST = "first"  # recorded now: the token may be used
    REUSED = "reused"  # already recorded: a replay
    TOO_MANY = "too_many"  # the peer holds max_live unexpired entries already


class SeenTokens(StoreBase):
    def use_token(self, issuer: str, jti: str, usable_until_ms: int, now_ms: int, *, max_live: int) -> TokenUse:
        """Record the first use of ``issuer``'s token ``jti``, remembered until ``usable_until_ms``."""
        with self._write() as connection:
            self._prune(connection, now_ms)
            live = connection.execute(
                sa.select(sa.func.count()).select_from(
                    sa.select(seen_tokens.c.jti).where(seen_tokens.c.issuer == issuer).limit(max_live).subquery()
                )
            ).scalar_one()
            if live >= max_live:
                already = connection.execute(
                    sa.select(seen_tokens.c.jti).where(seen_tokens.c.issuer == issuer, seen_tokens.c.jti == jti)
                ).first()
                return TokenUse.REUSED if already is not None else TokenUse.TOO_MANY
            inserted = connection.execute(
                insert(connection, seen_tokens)
                .values(issuer=issuer, jti=jti, usable_until_ms=usable_until_ms)
                .on_conflict_do_nothing(index_elements=["issuer", "jti"])
                .returning(seen_tokens.c.jti)
            ).first()
            return TokenUse.FIRST if inserted is not None else TokenUse.REUSED

    def live_tokens(self, now_ms: int) -> int:
        """How many remembered tokens could still be presented (for tests and operators)."""
        with self._read() as connection:
            query = sa.select(sa.func.count()).where(seen_tokens.c.usable_until_ms >= now_ms)
            return int(connection.execute(query).scalar_one())

    @staticmethod
    def _prune(connection: sa.Connection, now_ms: int) -> None:
        # SKIP LOCKED (PostgreSQL; SQLite serializes writers anyway): two api-servers pruning at
        # once take disjoint rows instead of waiting on, or deadlocking with, each other.
        expired = (
            sa.select(seen_tokens.c.issuer, seen_tokens.c.jti)
            .where(seen_tokens.c.usable_until_ms < now_ms)
            .limit(PRUNE_BATCH)
            .with_for_update(skip_locked=True)
        )
        connection.execute(seen_tokens.delete().where(sa.tuple_(seen_tokens.c.issuer, seen_tokens.c.jti).in_(expired)))

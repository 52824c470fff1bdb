"""Lifecycle: cancels that stick, lost peers, start timeouts.

``delivery_claimed_at_ms`` marks a delivery in flight (a peer's "not found" settles no cancel until
it has recorded its outcome), ``handed_off_at_ms`` starts the start timeout, ``withdraw_reason``
marks a job being withdrawn from a peer that did not start it, and ``iris_peers.unreachable_since_ms``
starts the clock of a lost peer. Jobs already handed off start their timeout from their promotion;
peers already unreachable from their last attempt.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("delivery_claimed_at_ms", sa.BigInteger, nullable=True))
    op.add_column("iris_jobs", sa.Column("handed_off_at_ms", sa.BigInteger, nullable=True))
    op.add_column("iris_jobs", sa.Column("withdraw_reason", sa.Text, nullable=False, server_default=""))
    op.add_column("iris_peers", sa.Column("unreachable_since_ms", sa.BigInteger, nullable=True))
    op.execute(
        "UPDATE iris_jobs SET handed_off_at_ms = COALESCE(handoff_since_ms, updated_at_ms) "
        "WHERE handoff_state = 'handed_off'"
    )
    op.execute("UPDATE iris_peers SET unreachable_since_ms = last_attempt_ms WHERE NOT reachable")


def downgrade() -> None:
    with op.batch_alter_table("iris_peers") as batch:  # SQLite rebuilds the table to drop columns
        batch.drop_column("unreachable_since_ms")
    with op.batch_alter_table("iris_jobs") as batch:
        batch.drop_column("withdraw_reason")
        batch.drop_column("handed_off_at_ms")
        batch.drop_column("delivery_claimed_at_ms")

"""Requeue: a handoff a peer could not take goes back to the queue, and its peer is told to drop it.

``handoff_since_ms`` starts the clock of the current handoff (promotion), ``requeue_count`` counts
what the job has spent of its requeue budget, ``avoided_peers`` maps the peers it must not be
placed on again, for now, to when that ends. ``iris_abandoned_handoffs`` holds the incarnations
left behind on a peer, to terminate there once it answers (it may have admitted one we never
heard about).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("handoff_since_ms", sa.BigInteger, nullable=True))
    op.add_column("iris_jobs", sa.Column("requeue_count", sa.Integer, nullable=False, server_default="0"))
    op.add_column("iris_jobs", sa.Column("avoided_peers", JSON, nullable=False, server_default=sa.text("'{}'")))
    # Handoffs already being delivered: their clock starts no later than their last change.
    op.execute("UPDATE iris_jobs SET handoff_since_ms = updated_at_ms WHERE handoff_state = 'pending'")
    op.create_table(
        "iris_abandoned_handoffs",
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("nonce", sa.Text, nullable=False),
        sa.Column("abandoned_at_ms", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("peer_id", "job_id", "nonce", name="pk_iris_abandoned_handoffs"),
    )


def downgrade() -> None:
    op.drop_table("iris_abandoned_handoffs")
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop columns
        batch.drop_column("avoided_peers")
        batch.drop_column("requeue_count")
        batch.drop_column("handoff_since_ms")

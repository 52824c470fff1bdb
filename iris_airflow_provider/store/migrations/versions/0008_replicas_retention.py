"""Replica status and retention: each job keeps its replicas as last reported, finished jobs are
found oldest first for pruning, and the incarnations a job replaced are listed so their output can
be pruned without scanning every line.

Revision ID: 0008
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("replicas", JSON, nullable=False, server_default=sa.text("'[]'")))
    op.create_index("ix_iris_jobs_finished_at_ms", "iris_jobs", ["finished_at_ms"])
    op.create_table(
        "iris_superseded_incarnations",
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("nonce", sa.Text, nullable=False),
        sa.Column("superseded_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "nonce", name="pk_iris_superseded_incarnations"),
    )
    op.create_index(
        "ix_iris_superseded_incarnations_superseded_at_ms", "iris_superseded_incarnations", ["superseded_at_ms"]
    )


def downgrade() -> None:
    op.drop_table("iris_superseded_incarnations")
    op.drop_index("ix_iris_jobs_finished_at_ms", table_name="iris_jobs")
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop columns
        batch.drop_column("replicas")

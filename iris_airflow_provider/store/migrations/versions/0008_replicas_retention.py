"""Replica status and retention: each job keeps its replicas as last reported, and finished jobs
are found oldest first for pruning.

Revision ID: 0008
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("replicas", JSON, nullable=False, server_default=sa.text("'[]'")))
    op.create_index("ix_iris_jobs_finished_at_ms", "iris_jobs", ["finished_at_ms"])


def downgrade() -> None:
    op.drop_index("ix_iris_jobs_finished_at_ms", table_name="iris_jobs")
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop columns
        batch.drop_column("replicas")

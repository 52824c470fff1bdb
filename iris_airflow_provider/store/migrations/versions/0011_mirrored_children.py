"""Children of a handed-off root, as its peer last reported them (states, exit codes, and where
relaying each one's output has got to): a job tree runs on one cluster and is mirrored back whole.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("children", JSON, nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column("children")

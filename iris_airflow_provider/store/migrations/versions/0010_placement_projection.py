"""What placement reads of a job's spec, in a column of its own, so the tick never parses specs.

Rows admitted before it keep NULL there; the tick parses their spec instead (they leave the queue
soon enough, and a rerun writes the column).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("placement", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column("placement")

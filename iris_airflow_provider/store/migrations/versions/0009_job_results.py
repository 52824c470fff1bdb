"""Job results: what an incarnation handed back at ``$IRIS_RESULT``, kept beside its nonce.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "iris_job_results",
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("nonce", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("recorded_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_iris_job_results"),
    )


def downgrade() -> None:
    op.drop_table("iris_job_results")

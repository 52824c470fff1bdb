"""A handed-off job's serving URLs, as its peer minted them for the incarnation running now (checked by
the parent before it keeps them; NULL until the peer reports any, and again once the job ends).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Python None as SQL NULL, as the schema declares it.
JSON = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("serving_urls", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iris_jobs") as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column("serving_urls")

"""Single-use peer tokens: ``iris_seen_tokens`` remembers each token's ``jti`` (per calling
cluster) until the token expires, so a captured token cannot be replayed.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "iris_seen_tokens",
        sa.Column("issuer", sa.Text, nullable=False),
        sa.Column("jti", sa.Text, nullable=False),
        sa.Column("usable_until_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("issuer", "jti", name="pk_iris_seen_tokens"),
    )
    op.create_index("ix_iris_seen_tokens_usable_until_ms", "iris_seen_tokens", ["usable_until_ms"])


def downgrade() -> None:
    op.drop_index("ix_iris_seen_tokens_usable_until_ms", table_name="iris_seen_tokens")
    op.drop_table("iris_seen_tokens")

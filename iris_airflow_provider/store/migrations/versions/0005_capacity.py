"""Capacity you can trust: reservations that last until the peer's reports show their job, and
backends held for starving jobs.

The reservation ledger (``iris_reservation_ledger``, keyed on each backend's observation and reset
by a newer one) goes: what is reserved on a backend is now read from the jobs in flight there, so
the job row itself is the reservation (written by the promotion's compare-and-set, ended by the
job's end or requeue). ``iris_jobs.holding_since_ms`` records when a report first said the job
holds capacity where it runs (accepted or running); ``iris_peers.observed_after_ms`` when this
cluster asked for the heartbeat whose numbers are stored: a reservation is released once the
numbers in use were asked for after its job was seen holding. ``iris_capacity_holds`` keeps the
backend each starving job held on the last tick (one per job, one per backend), so a hold stays put.

Revision ID: 0005
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("iris_jobs", sa.Column("holding_since_ms", sa.BigInteger, nullable=True))
    # Jobs already running where they were sent hold capacity there since at least their last change.
    op.execute(
        "UPDATE iris_jobs SET holding_since_ms = updated_at_ms "
        "WHERE direction = 'sent' AND state IN ('accepted', 'running')"
    )
    op.add_column("iris_peers", sa.Column("observed_after_ms", sa.BigInteger, nullable=True))
    op.create_table(
        "iris_capacity_holds",
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("backend_id", sa.Text, nullable=False),
        sa.Column("held_since_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_iris_capacity_holds"),
        sa.UniqueConstraint("peer_id", "backend_id", name="uq_iris_capacity_holds_peer_id_backend_id"),
    )
    op.drop_table("iris_reservation_ledger")


def downgrade() -> None:
    op.create_table(
        "iris_reservation_ledger",
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("backend_id", sa.Text, nullable=False),
        sa.Column("token", sa.Text, nullable=False),
        sa.Column("observation_epoch_ms", sa.BigInteger, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("peer_id", "backend_id", "token", name="pk_iris_reservation_ledger"),
        sa.CheckConstraint("amount >= 0", name="ck_iris_reservation_ledger_amount"),
    )
    op.drop_table("iris_capacity_holds")
    with op.batch_alter_table("iris_peers") as batch:  # SQLite rebuilds the table to drop columns
        batch.drop_column("observed_after_ms")
    with op.batch_alter_table("iris_jobs") as batch:
        batch.drop_column("holding_since_ms")

"""Federation store: jobs (local, sent, received), their event history, peers and their backends'
heartbeats, relayed job output, the reservation ledger, sync cursors and leases.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
SEQ = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "iris_jobs",
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("direction", sa.Text, nullable=False),
        sa.Column("handoff_state", sa.Text, nullable=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("peer_id", sa.Text, nullable=False, server_default=""),
        sa.Column("backend_id", sa.Text, nullable=False, server_default=""),
        sa.Column("owner_principal", sa.Text, nullable=False, server_default=""),
        sa.Column("submitting_user", sa.Text, nullable=False, server_default=""),
        sa.Column("nonce", sa.Text, nullable=False),
        sa.Column("cancel_intent_version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("priority_band", sa.Text, nullable=False),
        sa.Column("submitted_at_ms", sa.BigInteger, nullable=False),
        sa.Column("scheduling_deadline_ms", sa.BigInteger, nullable=True),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("error", sa.Text, nullable=False, server_default=""),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("started_at_ms", sa.BigInteger, nullable=True),
        sa.Column("finished_at_ms", sa.BigInteger, nullable=True),
        sa.Column("reported_at_ms", sa.BigInteger, nullable=True),
        sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
        sa.Column("row_version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("delivery_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_delivery_at_ms", sa.BigInteger, nullable=True),
        sa.Column("last_delivery_error", sa.Text, nullable=False, server_default=""),
        sa.Column("cancel_delivered_version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("log_cursor", sa.Text, nullable=False, server_default=""),
        sa.Column("last_log_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("origin_dag_id", sa.Text, nullable=True),
        sa.Column("origin_run_id", sa.Text, nullable=True),
        sa.Column("origin_task_id", sa.Text, nullable=True),
        sa.Column("origin_map_index", sa.Integer, nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_iris_jobs"),
        sa.CheckConstraint("direction IN ('local', 'sent', 'received')", name="ck_iris_jobs_direction"),
        sa.CheckConstraint(
            "state IN ('pending', 'accepted', 'running', 'succeeded', 'failed', 'killed', 'unschedulable')",
            name="ck_iris_jobs_state",
        ),
        sa.CheckConstraint(
            "(direction = 'sent' AND handoff_state IN ('queued', 'pending', 'handed_off', 'rejected')) "
            "OR (direction <> 'sent' AND handoff_state IS NULL)",
            name="ck_iris_jobs_handoff_state",
        ),
        sa.CheckConstraint("cancel_intent_version >= 0", name="ck_iris_jobs_cancel_intent_version"),
        sa.UniqueConstraint("direction", "peer_id", "nonce", name="uq_iris_jobs_direction_peer_id_nonce"),
    )
    op.create_index("ix_iris_jobs_direction_handoff_state", "iris_jobs", ["direction", "handoff_state"])
    op.create_index("ix_iris_jobs_submitted_at_ms", "iris_jobs", ["submitted_at_ms"])
    op.create_index("ix_iris_jobs_updated_at_ms", "iris_jobs", ["updated_at_ms"])
    # Listing newest first under one filter (the Federation page, ``iris-federation jobs``).
    op.create_index("ix_iris_jobs_state_submitted_at_ms", "iris_jobs", ["state", "submitted_at_ms"])
    op.create_index("ix_iris_jobs_peer_id_submitted_at_ms", "iris_jobs", ["peer_id", "submitted_at_ms"])
    op.create_index("ix_iris_jobs_submitting_user_submitted_at_ms", "iris_jobs", ["submitting_user", "submitted_at_ms"])
    op.create_index("ix_iris_jobs_origin_dag_id_submitted_at_ms", "iris_jobs", ["origin_dag_id", "submitted_at_ms"])

    op.create_table(
        "iris_job_events",
        sa.Column("seq", SEQ, nullable=False, autoincrement=True),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=True),
        sa.Column("handoff_state", sa.Text, nullable=True),
        sa.Column("peer_id", sa.Text, nullable=False, server_default=""),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("seq", name="pk_iris_job_events"),
    )
    op.create_index("ix_iris_job_events_job_id_seq", "iris_job_events", ["job_id", "seq"])

    op.create_table(
        "iris_job_logs",
        sa.Column("seq", SEQ, nullable=False, autoincrement=True),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("nonce", sa.Text, nullable=False),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_iris_job_logs"),
    )
    op.create_index("ix_iris_job_logs_job_id_seq", "iris_job_logs", ["job_id", "seq"])
    op.create_table(
        "iris_peers",
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("reachable", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("last_contact_ms", sa.BigInteger, nullable=True),
        sa.Column("last_attempt_ms", sa.BigInteger, nullable=True),
        sa.Column("last_error", sa.Text, nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("peer_id", name="pk_iris_peers"),
    )
    op.create_table(
        "iris_peer_backends",
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("backend_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False, server_default=""),
        sa.Column("attributes", JSON, nullable=False),
        sa.Column("availability", JSON, nullable=True),
        sa.Column("observation_epoch_ms", sa.BigInteger, nullable=True),
        sa.Column("received_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("peer_id", "backend_id", name="pk_iris_peer_backends"),
        sa.ForeignKeyConstraint(
            ["peer_id"], ["iris_peers.peer_id"], name="fk_iris_peer_backends_peer_id_iris_peers", ondelete="CASCADE"
        ),
    )
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
    op.create_table(
        "iris_peer_sync",
        sa.Column("peer_id", sa.Text, nullable=False),
        sa.Column("cursor", sa.Text, nullable=False, server_default=""),
        sa.Column("synced_at_ms", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("peer_id", name="pk_iris_peer_sync"),
    )
    op.create_table(
        "iris_leases",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_iris_leases"),
    )


def downgrade() -> None:
    for table in (
        "iris_leases",
        "iris_peer_sync",
        "iris_reservation_ledger",
        "iris_peer_backends",
        "iris_peers",
        "iris_job_logs",
        "iris_job_events",
        "iris_jobs",
    ):
        op.drop_table(table)

"""Tables of the federation store (SQLAlchemy Core). Alembic migrations create and evolve them.

Enums are text with CHECK constraints, so a row can never hold a state the code does not know,
and ``handoff_state`` exists exactly on jobs this cluster sent to a peer.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

VERSION_TABLE = "iris_alembic_version"  # Alembic's bookkeeping, named so it cannot clash with a host's own

Json = sa.JSON().with_variant(JSONB(), "postgresql")
# A JSON column whose Python None is SQL NULL (not JSON null), so that "IS NULL" means "none".
NullableJson = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

DIRECTIONS = ("local", "sent", "received")
HANDOFF_STATES = ("queued", "pending", "handed_off", "rejected")
JOB_STATES = ("pending", "accepted", "running", "succeeded", "failed", "killed", "unschedulable")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


jobs = sa.Table(
    "iris_jobs",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("direction", sa.Text, nullable=False),
    sa.Column("handoff_state", sa.Text, nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    # sent: the destination ("" while queued unpinned); received: the requesting cluster; local: "".
    sa.Column("peer_id", sa.Text, nullable=False, server_default=""),
    sa.Column("backend_id", sa.Text, nullable=False, server_default=""),
    sa.Column("owner_principal", sa.Text, nullable=False, server_default=""),
    sa.Column("submitting_user", sa.Text, nullable=False, server_default=""),
    # The incarnation: minted at each admission; a peer dedups redelivery on (requester, nonce).
    sa.Column("nonce", sa.Text, nullable=False),
    sa.Column("cancel_intent_version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("priority_band", sa.Text, nullable=False),
    sa.Column("submitted_at_ms", sa.BigInteger, nullable=False),
    sa.Column("scheduling_deadline_ms", sa.BigInteger, nullable=True),
    sa.Column("spec", Json, nullable=False),
    # What placement reads of the spec (core/placement_projection.py), so the tick never parses a
    # queued job's whole spec. NULL for rows admitted before it existed: their spec is parsed instead.
    sa.Column("placement", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=False, server_default=""),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("started_at_ms", sa.BigInteger, nullable=True),
    sa.Column("finished_at_ms", sa.BigInteger, nullable=True),
    # When the peer (or local backend) first reported on the job: "awaiting first status report" until then.
    sa.Column("reported_at_ms", sa.BigInteger, nullable=True),
    sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
    # Bumped by every write, so a poller can tell that anything changed with one comparison.
    sa.Column("row_version", sa.Integer, nullable=False, server_default="1"),
    # Delivery of a pending handoff: retried with exponential backoff until the peer answers for good.
    sa.Column("delivery_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_delivery_at_ms", sa.BigInteger, nullable=True),
    sa.Column("last_delivery_error", sa.Text, nullable=False, server_default=""),
    # Requeue (DESIGN.md, beyond the reference): when the current handoff was promoted, how many
    # times the job went back to the queue, and the peers it avoids for now ({peer: until ms}).
    sa.Column("handoff_since_ms", sa.BigInteger, nullable=True),
    sa.Column("requeue_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("avoided_peers", Json, nullable=False, server_default=sa.text("'{}'")),
    # When a report first said the job holds capacity where it runs (accepted or running), this
    # cluster's clock: until the peer's numbers are asked for after that, its gate stays reserved there.
    sa.Column("holding_since_ms", sa.BigInteger, nullable=True),
    # The cancel intent the peer (or local backend) has confirmed; re-driven while it lags the intent.
    sa.Column("cancel_delivered_version", sa.Integer, nullable=False, server_default="0"),
    # Lifecycle (core/cancel_settlement.py, core/start_timeout.py): when a delivery of this incarnation
    # started and has not recorded its outcome yet (a peer's "not found" settles no cancel meanwhile),
    # when the peer admitted it, and why it is being withdrawn from its peer ("": it is not).
    sa.Column("delivery_claimed_at_ms", sa.BigInteger, nullable=True),
    sa.Column("handed_off_at_ms", sa.BigInteger, nullable=True),
    sa.Column("withdraw_reason", sa.Text, nullable=False, server_default=""),
    # Where relaying the job's output from whoever runs it has got to (their opaque cursor), and the
    # newest relayed line here: waiting tasks fetch lines only when it moves.
    sa.Column("log_cursor", sa.Text, nullable=False, server_default=""),
    sa.Column("last_log_seq", sa.BigInteger, nullable=False, server_default="0"),
    # The Airflow task instance that submitted the job (for links back), when there is one.
    sa.Column("origin_dag_id", sa.Text, nullable=True),
    sa.Column("origin_run_id", sa.Text, nullable=True),
    sa.Column("origin_task_id", sa.Text, nullable=True),
    sa.Column("origin_map_index", sa.Integer, nullable=True),
    # Each replica as its runner last reported it: [{"index", "state", "exit_code"}].
    sa.Column("replicas", Json, nullable=False, server_default=sa.text("'[]'")),
    # A handed-off root's children as its peer last reported them (a tree runs on one cluster):
    # [{"job_id", "state", "exit_code", "error", "started_at_ms", "finished_at_ms", "log_cursor"}].
    sa.Column("children", Json, nullable=False, server_default=sa.text("'[]'")),
    # A handed-off job's serving URLs ({port name: URL}) as its peer minted them for the incarnation
    # running now, once checked (core/serving.py); NULL until the peer reports any, and again once it ends.
    sa.Column("serving_urls", NullableJson, nullable=True),
    sa.CheckConstraint(_in("direction", DIRECTIONS), name="direction"),
    sa.CheckConstraint(_in("state", JOB_STATES), name="state"),
    sa.CheckConstraint(
        f"(direction = 'sent' AND {_in('handoff_state', HANDOFF_STATES)}) "
        "OR (direction <> 'sent' AND handoff_state IS NULL)",
        name="handoff_state",
    ),
    sa.CheckConstraint("cancel_intent_version >= 0", name="cancel_intent_version"),
    sa.UniqueConstraint("direction", "peer_id", "nonce"),
    sa.Index("ix_iris_jobs_direction_handoff_state", "direction", "handoff_state"),
    sa.Index("ix_iris_jobs_submitted_at_ms", "submitted_at_ms"),
    # The triggerer's shared poller asks for what changed since its watermark, every interval.
    sa.Index("ix_iris_jobs_updated_at_ms", "updated_at_ms"),
    # The Federation page lists newest first, filtered by one of these: each filter reads its
    # index in page order instead of sorting the whole table (10,000s of jobs).
    sa.Index("ix_iris_jobs_state_submitted_at_ms", "state", "submitted_at_ms"),
    sa.Index("ix_iris_jobs_peer_id_submitted_at_ms", "peer_id", "submitted_at_ms"),
    sa.Index("ix_iris_jobs_submitting_user_submitted_at_ms", "submitting_user", "submitted_at_ms"),
    # Retention reads the oldest finished jobs, a batch per tick.
    sa.Index("ix_iris_jobs_finished_at_ms", "finished_at_ms"),
    sa.Index("ix_iris_jobs_origin_dag_id_submitted_at_ms", "origin_dag_id", "submitted_at_ms"),
)

job_events = sa.Table(
    "iris_job_events",
    metadata,
    sa.Column("seq", sa.Integer().with_variant(sa.BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Text, nullable=False),  # no foreign key: the history outlives the job
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=True),
    sa.Column("handoff_state", sa.Text, nullable=True),
    sa.Column("peer_id", sa.Text, nullable=False, server_default=""),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
    sa.Index("ix_iris_job_events_job_id_seq", "job_id", "seq"),
)

# Incarnations left behind on a peer when their job was requeued elsewhere: the peer may have
# admitted one without our hearing, so it is told to terminate it (by job id and nonce) once it answers.
abandoned_handoffs = sa.Table(
    "iris_abandoned_handoffs",
    metadata,
    sa.Column("peer_id", sa.Text, primary_key=True),
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("nonce", sa.Text, primary_key=True),
    sa.Column("abandoned_at_ms", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
)

# Incarnations a job replaced (a rerun, a requeue): their output is kept until the retention, then
# pruned by this index instead of a scan of every output line.
superseded_incarnations = sa.Table(
    "iris_superseded_incarnations",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("nonce", sa.Text, primary_key=True),
    sa.Column("superseded_at_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_iris_superseded_incarnations_superseded_at_ms", "superseded_at_ms"),
)

# What an incarnation handed back at $IRIS_RESULT (JSON text, at most 1 MiB), kept beside
# its nonce: a rerun's new incarnation never shows it. Apart from iris_jobs, whose rows every poll reads.
job_results = sa.Table(
    "iris_job_results",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("nonce", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("recorded_at_ms", sa.BigInteger, nullable=False),
)

job_logs = sa.Table(
    "iris_job_logs",
    metadata,
    sa.Column("seq", sa.Integer().with_variant(sa.BigInteger(), "postgresql"), primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Text, nullable=False),
    sa.Column("nonce", sa.Text, nullable=False),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("line", sa.Text, nullable=False),
    sa.Index("ix_iris_job_logs_job_id_seq", "job_id", "seq"),
)

peers = sa.Table(
    "iris_peers",
    metadata,
    sa.Column("peer_id", sa.Text, primary_key=True),
    sa.Column("reachable", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("last_contact_ms", sa.BigInteger, nullable=True),
    sa.Column("last_attempt_ms", sa.BigInteger, nullable=True),
    sa.Column("last_error", sa.Text, nullable=False, server_default=""),
    # Since when it has not answered (NULL: it answered the last heartbeat): lost after peer_lost_seconds.
    sa.Column("unreachable_since_ms", sa.BigInteger, nullable=True),
    # When this cluster asked for the heartbeat whose backends are stored (its clock): every number
    # in them was measured after this.
    sa.Column("observed_after_ms", sa.BigInteger, nullable=True),
)

peer_backends = sa.Table(
    "iris_peer_backends",
    metadata,
    sa.Column("peer_id", sa.Text, sa.ForeignKey("iris_peers.peer_id", ondelete="CASCADE"), primary_key=True),
    sa.Column("backend_id", sa.Text, primary_key=True),
    sa.Column("kind", sa.Text, nullable=False, server_default=""),
    sa.Column("attributes", Json, nullable=False),
    # The availability block exactly as the peer sent it; NULL for a shape-only backend.
    sa.Column("availability", Json, nullable=True),
    sa.Column("observation_epoch_ms", sa.BigInteger, nullable=True),
    sa.Column("received_at_ms", sa.BigInteger, nullable=False),
)

# The backend each starving job held after the last placement pass (see core/holds.py): one per
# job, one per backend. Rows of jobs no longer queued are ignored by the pass and replaced by the next.
capacity_holds = sa.Table(
    "iris_capacity_holds",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("peer_id", sa.Text, nullable=False),
    sa.Column("backend_id", sa.Text, nullable=False),
    sa.Column("held_since_ms", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("peer_id", "backend_id"),
)

peer_sync = sa.Table(
    "iris_peer_sync",
    metadata,
    sa.Column("peer_id", sa.Text, primary_key=True),
    sa.Column("cursor", sa.Text, nullable=False, server_default=""),  # opaque to us: the peer's own
    sa.Column("synced_at_ms", sa.BigInteger, nullable=True),
)

leases = sa.Table(
    "iris_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
)

# Peer tokens used here, each kept until it can no longer be accepted: a reused jti is a replay.
seen_tokens = sa.Table(
    "iris_seen_tokens",
    metadata,
    sa.Column("issuer", sa.Text, primary_key=True),  # the calling cluster
    sa.Column("jti", sa.Text, primary_key=True),
    sa.Column("usable_until_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_iris_seen_tokens_usable_until_ms", "usable_until_ms"),
)

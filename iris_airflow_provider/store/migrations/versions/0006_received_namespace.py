"""Received jobs live in their requester's namespace: ``<peer>:<job id>``.

A job a peer handed over was kept under the peer's own job id, so two peers (or a peer and this
cluster) could meet under one id, and a refusal told a peer which ids existed. Rows received
before this revision move to the new key, with their history and output, so nothing is lost and
the requester still finds them (it keeps using the plain job id on the wire).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_RECEIVED = "SELECT job_id FROM iris_jobs WHERE direction = 'received' AND job_id LIKE '/%'"
_PEER_OF = "(SELECT j.peer_id FROM iris_jobs j WHERE j.job_id = {table}.job_id AND j.direction = 'received')"


def upgrade() -> None:
    for table in ("iris_job_events", "iris_job_logs"):
        op.execute(
            f"UPDATE {table} SET job_id = {_PEER_OF.format(table=table)} || ':' || job_id WHERE job_id IN ({_RECEIVED})"
        )
    op.execute(f"UPDATE iris_jobs SET job_id = peer_id || ':' || job_id WHERE job_id IN ({_RECEIVED})")


def downgrade() -> None:
    for table in ("iris_job_events", "iris_job_logs"):
        op.execute(
            f"UPDATE {table} SET job_id = substr(job_id, length({_PEER_OF.format(table=table)}) + 2) "
            f"WHERE job_id IN (SELECT job_id FROM iris_jobs WHERE direction = 'received' AND job_id NOT LIKE '/%')"
        )
    op.execute(
        "UPDATE iris_jobs SET job_id = substr(job_id, length(peer_id) + 2) "
        "WHERE direction = 'received' AND job_id NOT LIKE '/%'"
    )

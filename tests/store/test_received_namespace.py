"""Received jobs move into their requester's namespace when a store upgrades: with their history
and output, and without touching this cluster's own jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.store.schema import job_events, job_logs
from iris_airflow_provider.store.store import FederationStore
from tests.postgres import scratch_database


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
    else:
        with scratch_database("iris_namespace") as url:
            yield url


def _job(connection: sa.Connection, job_id: str, direction: str, peer_id: str) -> None:
    connection.execute(
        sa.text(
            "INSERT INTO iris_jobs (job_id, direction, state, nonce, priority_band, submitted_at_ms, spec, "
            "updated_at_ms, peer_id) VALUES (:job_id, :direction, 'running', :nonce, 'PRIORITY_BAND_BATCH', 1, "
            ":spec, 1, :peer_id)"
        ),
        {
            "job_id": job_id,
            "direction": direction,
            "nonce": f"n-{direction}",
            "spec": f'{{"job_id": "{job_id}", "command": "true"}}',
            "peer_id": peer_id,
        },
    )
    connection.execute(job_events.insert().values(job_id=job_id, at_ms=1, kind="admitted", peer_id=peer_id))
    connection.execute(job_logs.insert().values(job_id=job_id, nonce=f"n-{direction}", at_ms=1, line=direction))


def test_jobs_received_before_the_namespace_move_into_it_with_their_history(empty_url: str) -> None:
    store = FederationStore.from_url(empty_url)
    try:
        store.migrate("0002")
        with store.engine.begin() as connection:
            _job(connection, "/alice/train", "received", "cw_east")  # "_" is a LIKE wildcard: kept literal
            _job(connection, "/bob/eval", "sent", "cw_east")  # ours, sent to that same peer: stays
        store.migrate()
        received = store.get_job("cw_east:/alice/train")
        assert received is not None and received.direction is Direction.RECEIVED
        assert store.get_job("/alice/train") is None
        assert [e.kind for e in store.events("cw_east:/alice/train")] == ["admitted"]
        assert [line for _, line in store.log_lines("cw_east:/alice/train")] == ["received"]
        sent = store.get_job("/bob/eval")
        assert sent is not None and [line for _, line in store.log_lines("/bob/eval")] == ["sent"]
        # The requester's changes are the jobs in its namespace, not ours that went its way.
        assert [key for key, _ in store.received_changes("cw_east", after_seq=0)] == ["cw_east:/alice/train"]
        assert store.received_changes("cwXeast", after_seq=0) == []
    finally:
        store.dispose()

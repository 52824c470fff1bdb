"""A job's history and relayed output: output lines of each incarnation (and where relaying got
to), the federation's own warnings in that output, and the history events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store.common import StoreBase, event, notice, touched
from iris_airflow_provider.store.records import JobEvent
from iris_airflow_provider.store.schema import job_events, job_logs, jobs


class Logs(StoreBase):
    def append_logs(self, job_id: str, nonce: str, lines: Sequence[str], cursor: str, now_ms: int) -> bool:
        """Keep new output lines of this incarnation and where reading got to, together."""
        this_incarnation = (jobs.c.job_id == job_id, jobs.c.nonce == nonce)
        with self._write() as connection:
            if connection.execute(sa.select(jobs.c.job_id).where(*this_incarnation)).first() is None:
                return False
            values: dict[str, Any] = {"log_cursor": cursor}
            if lines:
                seqs = connection.execute(
                    job_logs.insert().returning(job_logs.c.seq),
                    [{"job_id": job_id, "nonce": nonce, "at_ms": now_ms, "line": line} for line in lines],
                ).scalars()
                # A change waiting tasks notice: their poller then fetches the new lines.
                values.update(last_log_seq=max(seqs), **touched(now_ms))
            connection.execute(jobs.update().where(*this_incarnation).values(**values))
        return True

    def flag(self, job_id: str, nonce: str, kind: str, message: str, now_ms: int, *, peer_id: str = "") -> bool:
        """Warn about this incarnation: an event in its history, and a line in the output its waiting
        task relays into the task log (prefixed, so it is not taken for the job's own output)."""
        with self._write() as connection:
            current = connection.execute(
                sa.select(jobs.c.handoff_state).where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
            ).first()
            if current is None:
                return False
            event(connection, job_id, now_ms, kind, None, current[0], peer_id, message)
            notice(connection, job_id, nonce, f"Warning: {message}", now_ms)
        return True

    def log_lines(self, job_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]:
        query = (
            sa.select(job_logs.c.seq, job_logs.c.line)
            .where(job_logs.c.job_id == job_id, job_logs.c.seq > after_seq)
            .order_by(job_logs.c.seq)
            .limit(limit)
        )
        with self._read() as connection:
            return [(row[0], row[1]) for row in connection.execute(query)]

    def events(self, job_id: str) -> list[JobEvent]:
        query = sa.select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.seq)
        with self._read() as connection:
            return [JobEvent(**row) for row in connection.execute(query).mappings()]

    def record_event(self, job_id: str, kind: str, now_ms: int, detail: str = "") -> bool:
        """A history event without a state change (e.g. a replayed handoff), so syncs report the job again."""
        with self._write() as connection:
            return record_event(connection, job_id, kind, now_ms, detail)

    def latest_event_seq(self) -> int:
        with self._read() as connection:
            return int(connection.execute(sa.select(sa.func.max(job_events.c.seq))).scalar() or 0)


def record_event(connection: sa.Connection, job_id: str, kind: str, now_ms: int, detail: str = "") -> bool:
    """Append an event to a job's history as it stands (False when there is no such job)."""
    row = connection.execute(
        sa.select(jobs.c.state, jobs.c.handoff_state, jobs.c.peer_id).where(jobs.c.job_id == job_id)
    ).first()
    if row is None:
        return False
    event(connection, job_id, now_ms, kind, JobState(row[0]), row[1], row[2], detail)
    return True

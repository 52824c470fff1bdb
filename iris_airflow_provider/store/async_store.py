"""Non-blocking access to the store for code in the triggerer: snapshots of watched jobs, cancel,
and a history event (a killed task's).

A blocking driver in the triggerer would stall every trigger of the process, so this goes through
aiosqlite or asyncpg. Writes reuse the synchronous store's statements via ``run_sync``, which
SQLAlchemy runs over the async driver without blocking the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.states import Direction, HandoffState, JobState, pending_reason
from iris_airflow_provider.store.common import not_terminal, reported_by_runner
from iris_airflow_provider.store.engine import WRITE, create_async_store_engine
from iris_airflow_provider.store.jobs import request_cancel
from iris_airflow_provider.store.logs import record_event
from iris_airflow_provider.store.records import CancelOutcome, job_values
from iris_airflow_provider.store.schema import job_events, job_logs, jobs

# Job ids per query: asyncpg refuses more than 32,767 parameters per statement, SQLite (3.32+) 32,766
# (reading output takes two per job: its id and its own cursor).
MAX_IDS_PER_QUERY = 10_000

# What a waiting task needs to know about its job; the spec itself is never read while waiting.
SNAPSHOT_COLUMNS = (
    jobs.c.job_id,
    jobs.c.direction,
    jobs.c.state,
    jobs.c.handoff_state,
    jobs.c.peer_id,
    jobs.c.backend_id,
    jobs.c.error,
    jobs.c.exit_code,
    jobs.c.reported_at_ms,
    jobs.c.row_version,
    jobs.c.cancel_intent_version,
    jobs.c.updated_at_ms,
    jobs.c.nonce,
    jobs.c.last_log_seq,
    jobs.c.serving_urls.is_not(None).label("serving_reported"),  # the URLs themselves are read on resuming
)


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    job_id: str
    direction: Direction
    state: JobState
    handoff_state: HandoffState | None
    peer_id: str
    backend_id: str
    error: str
    exit_code: int | None
    reported: bool
    row_version: int
    cancel_intent_version: int
    updated_at_ms: int
    nonce: str = ""
    last_log_seq: int = 0
    serving_reported: bool = False  # a handed-off job's peer reported serving URLs for this incarnation

    @classmethod
    def from_row(cls, row: Any) -> JobSnapshot:
        """A row of :data:`SNAPSHOT_COLUMNS`."""
        values = job_values(row._mapping)
        values["reported"] = values.pop("reported_at_ms") is not None
        values["serving_reported"] = bool(values.get("serving_reported"))  # SQLite answers 0 or 1
        return cls(**values)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def pending_reason(self) -> str:
        return pending_reason(self)


class AsyncFederationStore:
    def __init__(self, url: str) -> None:
        self.engine = create_async_store_engine(url)
        self.queries = 0  # statements sent, for the shared-poller benchmark

    async def snapshots(self, job_ids: Sequence[str]) -> dict[str, JobSnapshot]:
        """These jobs as they are now (a job not in the store is left out), in one query per 10,000 ids."""
        ids = list(dict.fromkeys(job_ids))
        found: dict[str, JobSnapshot] = {}
        if not ids:
            return found
        async with self.engine.connect() as connection:
            for start in range(0, len(ids), MAX_IDS_PER_QUERY):
                self.queries += 1
                chunk = ids[start : start + MAX_IDS_PER_QUERY]
                result = await connection.execute(sa.select(*SNAPSHOT_COLUMNS).where(jobs.c.job_id.in_(chunk)))
                found.update((row.job_id, JobSnapshot.from_row(row)) for row in result)
        return found

    async def log_lines(
        self, after: Mapping[str, int], *, limit: int
    ) -> tuple[list[tuple[int, str, str, str]], set[str]]:
        """Relayed output of these jobs, each after its own last line read (``after``: job id -> seq):
        (seq, job id, nonce, line), oldest first within each query of up to 10,000 jobs, at most
        ``limit`` lines per query. Also returns the jobs whose every line after their own seq was read
        (their query returned fewer than ``limit`` lines)."""
        cursors = list(after.items())
        lines: list[tuple[int, str, str, str]] = []
        caught_up: set[str] = set()
        if not cursors:
            return lines, caught_up
        async with self.engine.connect() as connection:
            for start in range(0, len(cursors), MAX_IDS_PER_QUERY):
                self.queries += 1
                chunk = cursors[start : start + MAX_IDS_PER_QUERY]
                rows = (await connection.execute(_lines_after(chunk, limit))).all()
                lines.extend((row[0], row[1], row[2], row[3]) for row in rows)
                if len(rows) < limit:
                    caught_up.update(job_id for job_id, _ in chunk)
        return lines, caught_up

    async def changed_since(self, updated_at_ms: int) -> list[JobSnapshot]:
        """Every job written at or after ``updated_at_ms`` (by any writer's clock)."""
        self.queries += 1
        async with self.engine.connect() as connection:
            result = await connection.execute(sa.select(*SNAPSHOT_COLUMNS).where(jobs.c.updated_at_ms >= updated_at_ms))
            return [JobSnapshot.from_row(row) for row in result]

    async def latest_event_seq(self, kinds: Sequence[str]) -> int:
        """The newest history event of these kinds (0 when none): a cheap "anything new?" probe."""
        self.queries += 1
        async with self.engine.connect() as connection:
            query = sa.select(sa.func.max(job_events.c.seq)).where(job_events.c.kind.in_(list(kinds)))
            return int((await connection.execute(query)).scalar() or 0)

    async def in_flight_count(self) -> int:
        """Live jobs whose state someone else reports (peers, local backends), or with a cancel to route."""
        self.queries += 1
        async with self.engine.connect() as connection:
            query = sa.select(sa.func.count()).where(not_terminal(), reported_by_runner())
            return int((await connection.execute(query)).scalar() or 0)

    async def request_cancel(self, job_id: str, now_ms: int) -> CancelOutcome:
        self.queries += 1
        async with self.engine.connect() as connection:
            writer = await connection.execution_options(**{WRITE: True})
            async with writer.begin():
                return await writer.run_sync(request_cancel, job_id, now_ms)

    async def record_event(self, job_id: str, kind: str, now_ms: int, detail: str = "") -> bool:
        self.queries += 1
        async with self.engine.connect() as connection:
            writer = await connection.execution_options(**{WRITE: True})
            async with writer.begin():
                return bool(await writer.run_sync(record_event, job_id, kind, now_ms, detail))

    async def dispose(self) -> None:
        await self.engine.dispose()


def _lines_after(cursors: Sequence[tuple[str, int]], limit: int) -> sa.Select[Any]:
    """Output lines of each job after that job's own seq. A single lower bound for all (the smallest)
    would re-read every line between it and another job's cursor, and, once ``limit`` of those filled
    a read, never get past them."""
    after = (
        sa.values(sa.column("job_id", sa.Text), sa.column("after_seq", sa.BigInteger), name="cursors")
        .data(list(cursors))
        .cte("cursors")  # a CTE: SQLite accepts no column names on a VALUES subquery
    )
    return (
        sa.select(job_logs.c.seq, job_logs.c.job_id, job_logs.c.nonce, job_logs.c.line)
        .join(after, sa.and_(job_logs.c.job_id == after.c.job_id, job_logs.c.seq > after.c.after_seq))
        # Implied by the join, but it lets the database skip older output through the primary key.
        .where(job_logs.c.seq > min(seq for _, seq in cursors))
        .order_by(job_logs.c.seq)
        .limit(limit)
    )

"""What every part of the store shares: its transactions, and the statements several operations use
(an upsert-capable INSERT, the row touch, the history event, the terminal transition, the notice)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from iris_airflow_provider.core.states import TERMINAL, Direction, HandoffState, JobState
from iris_airflow_provider.store.engine import WRITE
from iris_airflow_provider.store.schema import job_events, job_logs, jobs, superseded_incarnations

TERMINAL_VALUES = tuple(s.value for s in TERMINAL)
RUN_HERE = (Direction.LOCAL.value, Direction.RECEIVED.value)  # jobs one of this cluster's backends runs
# Rows per batched statement: well under SQLite's and PostgreSQL's limits on bound parameters.
BATCH = 500

T = TypeVar("T")


@contextmanager
def write(engine: Engine) -> Iterator[sa.Connection]:
    """A write transaction (on SQLite ``BEGIN IMMEDIATE``: writers queue instead of failing)."""
    with engine.connect().execution_options(**{WRITE: True}) as connection, connection.begin():
        yield connection


@contextmanager
def read(engine: Engine) -> Iterator[sa.Connection]:
    """A read transaction: one consistent view for several statements."""
    with engine.connect() as connection, connection.begin():
        yield connection


class StoreBase:
    """The engine every part of :class:`~iris_airflow_provider.store.store.FederationStore` shares."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        with write(self.engine) as connection:
            yield connection

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with read(self.engine) as connection:
            yield connection


def insert(connection: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that supports ON CONFLICT on both PostgreSQL and SQLite."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def touched(now_ms: int) -> dict[str, Any]:
    """The columns every write to a job sets: pollers notice the change by ``row_version``."""
    return {"updated_at_ms": now_ms, "row_version": jobs.c.row_version + 1}


def not_terminal() -> sa.ColumnElement[bool]:
    return jobs.c.state.not_in(TERMINAL_VALUES)


def queued() -> sa.ColumnElement[bool]:
    """Sent jobs in the federation queue (not terminal; maybe cancelled)."""
    return sa.and_(
        jobs.c.direction == Direction.SENT.value, jobs.c.handoff_state == HandoffState.QUEUED.value, not_terminal()
    )


def placeable() -> sa.ColumnElement[bool]:
    """Queued jobs placement may still promote: uncancelled."""
    return sa.and_(queued(), jobs.c.cancel_intent_version == 0)


def reported_by_runner() -> sa.ColumnElement[bool]:
    """Jobs whose state their runner reports: this cluster's backends (local, received), or the peer of
    a pending or handed-off handoff."""
    return sa.or_(
        jobs.c.direction.in_(RUN_HERE),
        sa.and_(
            jobs.c.direction == Direction.SENT.value,
            jobs.c.handoff_state.in_([HandoffState.PENDING.value, HandoffState.HANDED_OFF.value]),
        ),
    )


def event_row(
    job_id: str,
    now_ms: int,
    kind: str,
    state: JobState | None,
    handoff: HandoffState | str | None,
    peer_id: str,
    detail: str | Direction = "",
) -> dict[str, Any]:
    """One history event as the row :func:`events` inserts."""
    return {
        "job_id": job_id,
        "at_ms": now_ms,
        "kind": kind,
        "state": state.value if state else None,
        "handoff_state": str(handoff) if handoff else None,
        "peer_id": peer_id,
        "detail": str(detail),
    }


def event(
    connection: sa.Connection,
    job_id: str,
    now_ms: int,
    kind: str,
    state: JobState | None,
    handoff: HandoffState | str | None,
    peer_id: str,
    detail: str | Direction = "",
) -> None:
    """Append to the job's history (in the transaction of the change it records)."""
    events(connection, [event_row(job_id, now_ms, kind, state, handoff, peer_id, detail)])


def events(connection: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Append several events (rows of :func:`event_row`) in one statement."""
    if rows:
        connection.execute(job_events.insert(), list(rows))


def chunked(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most :data:`BATCH`: one statement's worth of bound parameters each."""
    size = BATCH  # read when called: tests shrink it to exercise several batches
    for start in range(0, len(items), size):
        yield items[start : start + size]


def set_terminal(
    connection: sa.Connection,
    job_id: str,
    now_ms: int,
    state: JobState,
    error: str,
    handoff: HandoffState | str | None,
    peer_id: str,
) -> bool:
    """End a job that is not terminal yet, with its history event; False when it already ended."""
    changed = connection.execute(
        jobs.update()
        .where(jobs.c.job_id == job_id, not_terminal())
        .values(state=state.value, error=error, finished_at_ms=now_ms, serving_urls=sa.null(), **touched(now_ms))
    ).rowcount
    if changed:
        event(connection, job_id, now_ms, "state", state, handoff, peer_id, error)
    return bool(changed)


def notice(connection: sa.Connection, job_id: str, nonce: str, text: str, now_ms: int) -> None:
    """A line from the federation itself in the job's relayed output (prefixed, so it is not taken
    for the job's own), which its waiting task copies into the task log."""
    seq = connection.execute(
        job_logs.insert()
        .values(job_id=job_id, nonce=nonce, at_ms=now_ms, line=f"[iris-federation] {text}")
        .returning(job_logs.c.seq)
    ).scalar_one()
    connection.execute(jobs.update().where(jobs.c.job_id == job_id).values(last_log_seq=seq, **touched(now_ms)))


def supersede(connection: sa.Connection, job_id: str, nonce: str, now_ms: int) -> None:
    """Remember that ``nonce`` of ``job_id`` was replaced: its output is pruned after the retention."""
    connection.execute(
        insert(connection, superseded_incarnations)
        .values(job_id=job_id, nonce=nonce, superseded_at_ms=now_ms)
        .on_conflict_do_nothing()
    )

"""Read-only queries for monitoring (the Federation page, its JSON API and the CLI).

Lists are paged and counted in SQL, newest first, so a store with tens of thousands of jobs
answers a page in milliseconds: every filter has an index on ``(column, submitted_at_ms)``.
Nothing here writes; the operations themselves stay in :mod:`iris_airflow_provider.store.store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.store.common import TERMINAL_VALUES, not_terminal, read
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.schema import jobs
from iris_airflow_provider.store.store import FederationStore

MAX_FACET_VALUES = 500  # distinct peers / submitters offered as filter choices


@dataclass(frozen=True, slots=True)
class JobScope:
    """Which jobs a caller may see, by the Airflow DAG each job belongs to.

    A job belongs to the DAG of the task that submitted it (its origin); a job received from a peer
    without one, to ``received_dag_id`` (the caller's: the DAG that runs received jobs here); any
    other job without a DAG, to no DAG at all (only callers allowed on every DAG see those).
    ``dag_ids`` None: no restriction. The store knows no DAG by name: restricting callers name both.
    """

    dag_ids: frozenset[str] | None = None
    dagless: bool = True
    received_dag_id: str | None = None

    def __post_init__(self) -> None:
        if self.dag_ids is not None and self.received_dag_id is None:
            raise ValueError("a restricted JobScope must name received_dag_id, the DAG received jobs belong to")

    @classmethod
    def everything(cls) -> JobScope:
        return cls()

    def clause(self) -> sa.ColumnElement[bool] | None:
        if self.dag_ids is None:
            return None
        no_origin = jobs.c.origin_dag_id.is_(None)
        allowed: list[sa.ColumnElement[bool]] = []
        if self.dag_ids:
            allowed.append(jobs.c.origin_dag_id.in_(sorted(self.dag_ids)))
        if self.received_dag_id in self.dag_ids:
            allowed.append(sa.and_(no_origin, jobs.c.direction == Direction.RECEIVED.value))
        if self.dagless:
            allowed.append(sa.and_(no_origin, jobs.c.direction != Direction.RECEIVED.value))
        return sa.or_(*allowed) if allowed else sa.false()


def job_dag_id(job: JobRecord, *, received_dag_id: str) -> str | None:
    """The Airflow DAG whose permissions govern ``job`` (see :class:`JobScope`): its origin's, or
    ``received_dag_id`` for a job received from a peer without one."""
    if job.origin is not None:
        return job.origin.dag_id
    return received_dag_id if job.direction is Direction.RECEIVED else None


@dataclass(frozen=True, slots=True)
class JobFilter:
    states: tuple[JobState, ...] = ()
    directions: tuple[Direction, ...] = ()
    peer_id: str | None = None  # "" selects jobs with no peer (local, or queued unpinned)
    submitter: str | None = None
    dag_id: str | None = None
    job_id_contains: str | None = None  # case-insensitive substring of the job id
    active: bool | None = None  # True: not terminal; False: terminal

    def clauses(self) -> list[sa.ColumnElement[bool]]:
        where: list[sa.ColumnElement[bool]] = []
        if self.states:
            where.append(jobs.c.state.in_([s.value for s in self.states]))
        if self.directions:
            where.append(jobs.c.direction.in_([d.value for d in self.directions]))
        if self.peer_id is not None:
            where.append(jobs.c.peer_id == self.peer_id)
        if self.submitter is not None:
            where.append(jobs.c.submitting_user == self.submitter)
        if self.dag_id is not None:
            where.append(jobs.c.origin_dag_id == self.dag_id)
        if self.job_id_contains:
            # autoescape: job ids are full of "_", which LIKE would read as a wildcard.
            where.append(jobs.c.job_id.icontains(self.job_id_contains, autoescape=True))
        if self.active is True:
            where.append(not_terminal())
        elif self.active is False:
            where.append(jobs.c.state.in_(TERMINAL_VALUES))
        return where


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobRecord]
    total: int
    limit: int
    offset: int


@dataclass(frozen=True, slots=True)
class Facets:
    """What the filters can choose from, within a scope: counts per state, peers and submitters."""

    states: dict[str, int] = field(default_factory=dict)
    peers: list[str] = field(default_factory=list)
    submitters: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ActiveCount:
    """Non-terminal jobs per (direction, peer, backend, state)."""

    direction: Direction
    peer_id: str
    backend_id: str
    state: JobState
    count: int


class MonitoringQueries:
    def __init__(self, store: FederationStore) -> None:
        self.store = store

    def _read(self) -> AbstractContextManager[sa.Connection]:
        return read(self.store.engine)

    def list_jobs(
        self, job_filter: JobFilter = JobFilter(), scope: JobScope = JobScope(), *, limit: int = 50, offset: int = 0
    ) -> JobPage:
        page, count = self.page_queries(job_filter, scope, limit=limit, offset=offset)
        with self._read() as connection:
            rows = connection.execute(page).mappings().all()
            total = int(connection.execute(count).scalar_one())
        return JobPage([JobRecord.from_row(row) for row in rows], total, limit, offset)

    @staticmethod
    def page_queries(
        job_filter: JobFilter, scope: JobScope, *, limit: int, offset: int
    ) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The page's SELECT (newest first; job id breaks ties) and its COUNT."""
        where = job_filter.clauses()
        if (allowed := scope.clause()) is not None:
            where.append(allowed)
        page = (
            sa.select(jobs)
            .where(*where)
            .order_by(jobs.c.submitted_at_ms.desc(), jobs.c.job_id.desc())
            .limit(limit)
            .offset(offset)
        )
        return page, sa.select(sa.func.count()).select_from(jobs).where(*where)

    def facets(self, scope: JobScope = JobScope()) -> Facets:
        allowed = scope.clause()
        where = [allowed] if allowed is not None else []
        by_state = sa.select(jobs.c.state, sa.func.count()).where(*where).group_by(jobs.c.state)
        peer_ids, submitters = (_choices(column, where) for column in (jobs.c.peer_id, jobs.c.submitting_user))
        with self._read() as connection:
            states = {row[0]: int(row[1]) for row in connection.execute(by_state)}
            peers = [row[0] for row in connection.execute(peer_ids)]
            users = [row[0] for row in connection.execute(submitters)]
        return Facets({s.value: states.get(s.value, 0) for s in JobState}, peers, users)

    def origin_dag_ids(self) -> list[str]:
        """Every DAG that submitted a job still in the store."""
        query = (
            sa.select(jobs.c.origin_dag_id)
            .where(jobs.c.origin_dag_id.is_not(None))
            .distinct()
            .order_by(jobs.c.origin_dag_id)
        )
        with self._read() as connection:
            return [row[0] for row in connection.execute(query)]

    def active_counts(self, directions: Sequence[Direction] = tuple(Direction)) -> list[ActiveCount]:
        query = (
            sa.select(jobs.c.direction, jobs.c.peer_id, jobs.c.backend_id, jobs.c.state, sa.func.count())
            .where(not_terminal(), jobs.c.direction.in_([d.value for d in directions]))
            .group_by(jobs.c.direction, jobs.c.peer_id, jobs.c.backend_id, jobs.c.state)
        )
        with self._read() as connection:
            return [
                ActiveCount(Direction(row[0]), row[1], row[2], JobState(row[3]), int(row[4]))
                for row in connection.execute(query)
            ]


def _choices(column: sa.Column[str], where: list[sa.ColumnElement[bool]]) -> sa.Select[Any]:
    """The distinct non-empty values of ``column`` within ``where``, sorted, at most MAX_FACET_VALUES."""
    return sa.select(column).where(column != "", *where).distinct().order_by(column).limit(MAX_FACET_VALUES)

"""Deferred waits in one triggerer: the shared poller against one query per trigger (a benchmark, not a test).

One asyncio event loop runs N concurrent ``FederationJobTrigger(...).run()`` generators (the real
trigger class, consumed as the triggerer does: ``async for event in trigger.run()``) on N jobs
admitted to a fresh store, while a writer in another process moves a fraction of the jobs
through queued -> pending (promoted) -> running -> succeeded over the waiting period. Waits whose
job succeeds fire ``reached``; the others reach their deadline at the end of the period and fire
``timeout``. The same workload then runs in a baseline mode: a plain per-trigger polling loop,
one ``AsyncFederationStore.snapshots([job_id])`` per wait per interval (the same change logging,
deadline and event; one shared engine). Measured per mode, for this process only (the writer
runs elsewhere):

- store queries: every ``AsyncFederationStore`` query of the process (``.queries`` summed over
  every store created), per second and per poll interval; SQL statements as the driver saw them
  (``BEGIN`` included) and connections opened;
- process CPU (``time.process_time``, driver threads included), the event-loop thread's own CPU,
  and the event-loop lag (the triggerer warns past 0.2 s), with what explains the stalls: the
  stall of N connection lookups alone (each trigger's ``aget_url`` before it subscribes, timed
  separately) and full garbage collections;
- notification latency: from the writer's commit to the waiting trigger logging the new state;
- the events every wait ended with, and any errors.

Run from the repository root::

    .venv/bin/python -m bench.poller_bench                     # 5,000 waits on SQLite (about 1.5 minutes)
    .venv/bin/python -m bench.poller_bench --waits 500
    .venv/bin/python -m bench.poller_bench --postgres --json   # scratch database on 127.0.0.1:5432
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.store.records import NewIncarnation

if __package__ in (None, ""):  # run as ``python bench/poller_bench.py``: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Airflow reads its configuration at import: keep it away from ~/airflow and quiet.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="iris-poller-bench-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{os.environ['AIRFLOW_HOME']}/airflow.db")

import argparse
import asyncio
import gc
import json
import logging
import multiprocessing
import platform
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.store.async_store import AsyncFederationStore, JobSnapshot
from iris_airflow_provider.store.jobs import incarnation
from iris_airflow_provider.store.schema import jobs as jobs_table
from iris_airflow_provider.store.store import FederationStore
from iris_airflow_provider.triggers.federation import FederationJobTrigger, describe, reached
from iris_airflow_provider.triggers.poller import SharedJobPoller

MODES = ("shared", "baseline")
MODE_TITLES = {"shared": "shared poller", "baseline": "one query per trigger"}
STEPS = ("pending", "running", "succeeded")
PEER = "cw-h100"
GOAL_RATIO = 50.0
ADMITTED_AGO_MS = 3_600_000  # the jobs were queued an hour before the waits start


# The workload ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    waits: int
    moving: int  # jobs the writer moves through every step
    seconds: float  # the waiting period: every wait has this deadline
    interval: float  # poll interval
    step_gap: float  # seconds between one job's steps
    seed: int

    def job_ids(self) -> list[str]:
        return [f"/bench/job-{i:06d}" for i in range(self.waits)]

    def schedule(self) -> list[tuple[float, str, str]]:
        """(seconds after the start, job id, step) for every write, in time order.

        The moving jobs are drawn at random and start one after the other, evenly over the period,
        leaving room for their last step and for the waits to see it before the deadline.
        """
        rng = random.Random(self.seed)
        moving = sorted(rng.sample(self.job_ids(), self.moving))
        rng.shuffle(moving)
        first, last = 1.0, max(1.0, self.seconds - 2 * self.step_gap - 3.0)
        writes = []
        for index, job_id in enumerate(moving):
            start = first + (last - first) * index / max(1, len(moving) - 1)
            for number, step in enumerate(STEPS):
                writes.append((start + number * self.step_gap, job_id, step))
        return sorted(writes)


def create_store(url: str, workload: Workload) -> float:
    """Migrate a fresh store and admit every job, queued for a peer, with admission's own columns
    (inserted in bulk: 50,000 admissions one by one would take minutes); returns the seconds it took."""
    started = time.perf_counter()
    admitted_ms = int(time.time() * 1000) - ADMITTED_AGO_MS
    store = FederationStore.from_url(url)
    try:
        store.migrate()
        rows = []
        for job_id in workload.job_ids():
            spec = parse_job(
                {"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}}}
            )
            new = NewIncarnation(spec, direction=Direction.SENT, submitting_user="bench@example.com")
            rows.append({"job_id": job_id, "updated_at_ms": admitted_ms, **incarnation(new, admitted_ms)})
        with store.engine.begin() as connection:
            for start in range(0, len(rows), 2000):
                connection.execute(sa.insert(jobs_table), rows[start : start + 2000])
        if store.engine.dialect.name == "postgresql":  # statistics, as autovacuum would gather them soon after
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.exec_driver_sql("ANALYZE")
    finally:
        store.dispose()
    return time.perf_counter() - started


def writer_main(url: str, schedule: list[tuple[float, str, str]], pipe: Connection) -> None:
    """The other process writing to the store (a placement tick, a peer's reports) on a schedule.

    Sends ``ready``, waits for the start time (wall clock), then performs every write when due and
    sends back ``(job id, step, wall time after commit)`` for each.
    """
    store = FederationStore.from_url(url)
    nonces = {job_id: job.nonce for job_id, job in store.get_jobs({job_id for _, job_id, _ in schedule}).items()}
    pipe.send("ready")
    t0 = pipe.recv()
    done: list[tuple[str, str, float]] = []
    lag = 0.0
    index = 0
    while index < len(schedule):
        now = time.time()
        if t0 + schedule[index][0] > now:
            time.sleep(min(0.02, t0 + schedule[index][0] - now))
            continue
        due = []
        while index < len(schedule) and t0 + schedule[index][0] <= now:
            due.append(schedule[index])
            index += 1
        lag = max(lag, now - (t0 + due[0][0]))
        promote = [job_id for _, job_id, step in due if step == "pending"]
        if promote:
            now_ms = int(time.time() * 1000)
            store.apply_promotions([Promotion(job_id, PEER, "default", False, {}, None) for job_id in promote], now_ms)
            committed = time.time()
            done.extend((job_id, "pending", committed) for job_id in promote)
        for _, job_id, step in due:
            if step == "pending":
                continue
            state = JobState.RUNNING if step == "running" else JobState.SUCCEEDED
            exit_code = 0 if state is JobState.SUCCEEDED else None
            store.mirror(
                JobReport(job_id, nonces[job_id], state, "default", exit_code=exit_code), int(time.time() * 1000)
            )
            done.append((job_id, step, time.time()))
    store.dispose()
    pipe.send((done, lag))


@contextmanager
def writer_process(url: str, schedule: list[tuple[float, str, str]]) -> Iterator[Callable[[float], Any]]:
    """Start the writer; yields ``start(t0)``, which returns a function collecting its results."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=writer_main, args=(url, schedule, theirs), daemon=True)
    process.start()
    try:
        while not ours.poll(0.1):
            if not process.is_alive():
                raise RuntimeError(f"the writer process died at start (exit code {process.exitcode})")
        if ours.recv() != "ready":
            raise RuntimeError("the writer process did not start")

        def start(t0: float) -> Callable[[], tuple[list[tuple[str, str, float]], float]]:
            ours.send(t0)

            def results() -> tuple[list[tuple[str, str, float]], float]:
                if not ours.poll(120):
                    raise RuntimeError("the writer process did not finish")
                done, lag = ours.recv()
                return done, lag

            return results

        yield start
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()


# Counting --------------------------------------------------------------------------------------------


class Counters:
    """Every async store of this process and every SQL statement and connection its drivers saw."""

    def __init__(self) -> None:
        self.stores: list[AsyncFederationStore] = []
        self.statements = 0
        self.connections = 0

    @property
    def queries(self) -> int:
        return sum(store.queries for store in self.stores)

    @contextmanager
    def installed(self) -> Iterator[Counters]:
        original_init = AsyncFederationStore.__init__
        counters = self

        def tracking_init(store: AsyncFederationStore, url: str) -> None:
            original_init(store, url)
            counters.stores.append(store)

        def on_statement(*_: Any) -> None:
            self.statements += 1

        def on_connect(*_: Any) -> None:
            self.connections += 1

        AsyncFederationStore.__init__ = tracking_init  # type: ignore[method-assign]
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_statement)
        sa.event.listen(sa.pool.Pool, "connect", on_connect)
        try:
            yield self
        finally:
            AsyncFederationStore.__init__ = original_init  # type: ignore[method-assign]
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_statement)
            sa.event.remove(sa.pool.Pool, "connect", on_connect)


class Recorder:
    """Stands in for a trigger's logger: keeps (wall time, job id, line) instead of printing 20,000 lines."""

    def __init__(self, job_id: str, sink: list[tuple[float, str, str]]) -> None:
        self.job_id = job_id
        self.sink = sink

    def info(self, message: str, *args: Any) -> None:
        self.sink.append((time.time(), self.job_id, message % args if args else message))

    def warning(self, message: str, *args: Any, **_: Any) -> None:
        self.info(message, *args)

    error = exception = debug = warning


_STATE = re.compile(r" is (\w+)")


def step_of(line: str) -> str | None:
    """Which write a logged state shows (the writer's steps), from ``describe``'s wording."""
    match = _STATE.search(line)
    state = match.group(1) if match else ""
    if state in ("running", "succeeded"):
        return state
    if "(handoff pending)" in line:
        return "pending"
    return None


# One run ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    waits: int
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    loop_cpu_seconds: float = 0.0
    queries: int = 0
    statements: int = 0
    connections: int = 0
    queries_per_interval: list[int] = field(default_factory=list)
    loop_lag_max_ms: float = 0.0
    loop_lag_p99_ms: float = 0.0
    loop_stalls: list[tuple[float, int]] = field(default_factory=list)
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    latency_by_step_p50_ms: dict[str, float | None] = field(default_factory=dict)
    first_seen_ms: dict[str, float | None] = field(default_factory=dict)
    missed_notifications: int = 0
    events: dict[str, int] = field(default_factory=dict)
    wrong_events: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    writer_lag_ms: float = 0.0
    pollers_left: int = 0
    wait_seconds: float = 0.0  # summed over every wait
    lookup_stall_ms: float | None = None
    gc_full_collections: int = 0
    gc_longest_ms: float = 0.0

    @property
    def queries_per_second(self) -> float:
        return self.queries / self.wall_seconds if self.wall_seconds else 0.0

    def summary(self, interval: float) -> dict[str, Any]:
        per_interval = self.queries_per_interval or [0]
        return {
            "mode": self.mode,
            "waits": self.waits,
            "wall_seconds": round(self.wall_seconds, 2),
            "queries": self.queries,
            "queries_per_second": round(self.queries_per_second, 2),
            "queries_per_interval_mean": round(self.queries / (self.wall_seconds / interval), 2),
            "queries_per_interval_median": statistics.median(per_interval),
            "queries_per_interval_max": max(per_interval),
            "statements": self.statements,
            "connections": self.connections,
            "cpu_seconds": round(self.cpu_seconds, 2),
            "cpu_percent_of_one_core": round(100 * self.cpu_seconds / self.wall_seconds, 1),
            "loop_thread_cpu_seconds": round(self.loop_cpu_seconds, 2),
            "loop_lag_max_ms": round(self.loop_lag_max_ms, 1),
            "loop_lag_p99_ms": round(self.loop_lag_p99_ms, 1),
            "loop_stalls_over_200ms": self.loop_stalls,
            "gc_full_collections": self.gc_full_collections,
            "gc_longest_full_collection_ms": round(self.gc_longest_ms),
            "connection_lookup_stall_ms": None if self.lookup_stall_ms is None else round(self.lookup_stall_ms),
            "latency_ms": self.latency_ms,
            "latency_by_step_p50_ms": self.latency_by_step_p50_ms,
            "first_seen_ms": self.first_seen_ms,
            "missed_notifications": self.missed_notifications,
            "events": self.events,
            "wrong_events": self.wrong_events,
            "errors": self.errors,
            "writer_lag_ms": round(self.writer_lag_ms, 1),
            "pollers_left": self.pollers_left,
            # One query per wait per look (the baseline): how often each wait really looked at its job.
            "seconds_between_a_waits_polls": round(self.wait_seconds / self.queries, 2)
            if self.mode == "baseline" and self.queries
            else None,
        }


async def baseline_wait(
    store: AsyncFederationStore, job_id: str, log: Recorder, interval: float, deadline_ms: int
) -> dict[str, Any]:
    """What a trigger without the shared poller does: its own query every interval."""
    last: JobSnapshot | None = None
    while True:
        if time.time() * 1000 >= deadline_ms:
            return {"status": "timeout", "job_id": job_id}
        snapshot = (await store.snapshots([job_id])).get(job_id)
        if snapshot is None:
            return {"status": "missing", "job_id": job_id}
        if last is None or (snapshot.state, snapshot.handoff_state, snapshot.pending_reason, snapshot.peer_id) != (
            last.state,
            last.handoff_state,
            last.pending_reason,
            last.peer_id,
        ):
            log.info(describe(snapshot))
        last = snapshot
        if reached(snapshot, "completion"):
            return {"status": "reached", "job_id": job_id, "state": snapshot.state.value}
        await asyncio.sleep(max(0.0, min(interval, deadline_ms / 1000 - time.time())))


async def run_waits(
    mode: str, url: str, workload: Workload, counters: Counters, start_writer: Callable[[float], Any]
) -> tuple[Result, list[tuple[float, str, str]], dict[str, float], Any]:
    result = Result(mode, workload.waits)
    lines: list[tuple[float, str, str]] = []
    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    events: dict[str, int] = {}
    errors: dict[str, int] = {}
    wrong = 0
    moving = {job_id for _, job_id, _ in workload.schedule()}
    # The baseline shares one engine (a pool of connections); only the queries are per trigger.
    baseline_store = AsyncFederationStore(await _hook_url()) if mode == "baseline" else None

    async def one(job_id: str, deadline_ms: int) -> None:
        nonlocal wrong
        log = Recorder(job_id, lines)
        started[job_id] = time.time()
        try:
            if mode == "shared":
                trigger = FederationJobTrigger(
                    job_id, until="completion", poll_interval=workload.interval, deadline_ms=deadline_ms
                )
                trigger._log = log  # type: ignore[assignment]  # record instead of printing
                payloads = [event.payload async for event in trigger.run()]  # as the triggerer: to the end
                payload: dict[str, Any] = payloads[0] if len(payloads) == 1 else {"status": f"{len(payloads)} events"}
            else:
                assert baseline_store is not None
                # Triggers start at different moments in a real triggerer: spread the first polls.
                await asyncio.sleep(random.random() * workload.interval)
                payload = await baseline_wait(baseline_store, job_id, log, workload.interval, deadline_ms)
        except Exception as error:
            errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            return
        ended[job_id] = time.time()
        status = payload.get("status", "?")
        events[status] = events.get(status, 0) + 1
        expected = ("reached", "succeeded") if job_id in moving else ("timeout", None)
        if (status, payload.get("state") if status == "reached" else None) != expected:
            wrong += 1

    lags: list[tuple[float, float]] = []  # (lag, seconds after the start)
    running = True

    async def lag_probe() -> None:
        while running:
            before = time.perf_counter()
            await asyncio.sleep(0.05)
            lags.append((time.perf_counter() - before - 0.05, before - wall0))

    samples: list[int] = []

    async def sampler() -> None:
        while running:
            await asyncio.sleep(workload.interval)
            samples.append(counters.queries)

    counters.stores = [baseline_store] if baseline_store else []
    counters.statements = counters.connections = 0
    t0 = time.time()
    results = start_writer(t0)
    deadline_ms = int((t0 + workload.seconds) * 1000)
    cpu0, loop_cpu0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    probes = [asyncio.create_task(lag_probe()), asyncio.create_task(sampler())]
    gc_pauses: list[float] = []
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        # Full collections pause everything; the heap of a process that imported Airflow is large.
        if info["generation"] == 2:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                gc_pauses.append(time.perf_counter() - gc_started[0])

    gc.callbacks.append(on_gc)
    waits = []
    for job_id in workload.job_ids():
        waits.append(asyncio.create_task(one(job_id, deadline_ms)))
        await asyncio.sleep(0)  # as the triggerer's ``create_triggers``: one new trigger per event-loop step
    await asyncio.gather(*waits)
    result.wall_seconds = time.perf_counter() - wall0
    result.cpu_seconds = time.process_time() - cpu0
    result.loop_cpu_seconds = time.thread_time() - loop_cpu0
    running = False
    await asyncio.gather(*probes)
    gc.callbacks.remove(on_gc)
    result.gc_full_collections = len(gc_pauses)
    result.gc_longest_ms = 1000 * max(gc_pauses, default=0.0)
    if baseline_store is not None:
        await baseline_store.dispose()
    result.queries, result.statements, result.connections = counters.queries, counters.statements, counters.connections
    result.queries_per_interval = [b - a for a, b in zip([0, *samples], samples, strict=False)]
    lags.sort()
    if lags:
        result.loop_lag_max_ms = 1000 * lags[-1][0]
        result.loop_lag_p99_ms = 1000 * lags[int(0.99 * (len(lags) - 1))][0]
        # When the loop stalled longest, and every stall over the triggerer's 0.2 s warning threshold.
        result.loop_stalls = [
            (round(at, 2), round(1000 * lag)) for lag, at in sorted(lags, key=lambda x: x[1]) if lag > 0.2
        ]
    result.events, result.errors, result.wrong_events = events, errors, wrong
    result.pollers_left = len(SharedJobPoller._pollers)
    result.wait_seconds = sum(ended[job_id] - started[job_id] for job_id in ended)
    return result, lines, started, results


async def _hook_url() -> str:
    from iris_airflow_provider.hooks.federation_store import FederationStoreHook

    return await FederationStoreHook().aget_url()


async def lookup_stall(waits: int) -> float:
    """The longest event-loop stall of ``waits`` triggers' first step alone: resolving the store's
    connection (``FederationStoreHook.aget_url``), which each trigger does before it subscribes."""
    longest = 0.0
    running = True

    async def probe() -> None:
        nonlocal longest
        while running:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            longest = max(longest, time.perf_counter() - before - 0.01)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    await asyncio.gather(*(_hook_url() for _ in range(waits)))
    running = False
    await task
    return longest


def latencies(
    result: Result,
    lines: Sequence[tuple[float, str, str]],
    started: dict[str, float],
    writes: Sequence[tuple[str, str, float]],
) -> None:
    """From the writer's commit to the first logged line showing it, per write."""
    first_line: dict[str, float] = {}
    seen: dict[tuple[str, str], float] = {}
    for at, job_id, line in lines:
        first_line.setdefault(job_id, at)
        step = step_of(line)
        if step is not None:
            seen.setdefault((job_id, step), at)
    all_ms: list[float] = []
    by_step: dict[str, list[float]] = {step: [] for step in STEPS}
    missed = 0
    for job_id, step, committed in writes:
        at = seen.get((job_id, step))
        if at is None:
            missed += 1
            continue
        by_step[step].append(1000 * (at - committed))
        all_ms.append(1000 * (at - committed))
    result.latency_ms = _percentiles(all_ms)
    result.latency_by_step_p50_ms = {
        step: round(statistics.median(values), 1) if values else None for step, values in by_step.items()
    }
    result.first_seen_ms = _percentiles([1000 * (at - started[job_id]) for job_id, at in first_line.items()])
    result.missed_notifications = missed


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    values = sorted(values)

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(values[-1], 1), "n": len(values)}


def run_mode(mode: str, workload: Workload, postgres: bool, counters: Counters) -> tuple[Result, float]:
    with ExitStack() as stack:
        if postgres:
            from tests.postgres import scratch_database

            url = stack.enter_context(scratch_database("iris_poller_bench"))
        else:
            home = stack.enter_context(tempfile.TemporaryDirectory(prefix="iris-poller-bench-"))
            url = f"sqlite:///{home}/federation.db"
        admit_seconds = create_store(url, workload)
        os.environ["AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT"] = json.dumps({"conn_type": "irisfederation", "host": url})
        start_writer = stack.enter_context(writer_process(url, workload.schedule()))
        result, lines, started, collect = asyncio.run(run_waits(mode, url, workload, counters, start_writer))
        writes, result.writer_lag_ms = collect()
        result.writer_lag_ms *= 1000
        if mode == "shared":
            result.lookup_stall_ms = 1000 * asyncio.run(lookup_stall(workload.waits))
        latencies(result, lines, started, writes)
        return result, admit_seconds


# Output ----------------------------------------------------------------------------------------------


def environment(postgres: bool) -> dict[str, Any]:
    import sqlite3

    import aiosqlite

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "sqlalchemy": sa.__version__,
    }
    if postgres:
        import asyncpg

        from tests.postgres import ADMIN_URL

        engine = sa.create_engine(ADMIN_URL)
        try:
            with engine.connect() as connection:
                version = connection.exec_driver_sql("SHOW server_version").scalar()
        finally:
            engine.dispose()
        env["database"] = f"PostgreSQL {version} at {sa.make_url(ADMIN_URL).host} (asyncpg {asyncpg.__version__})"
    else:
        env["database"] = f"SQLite {sqlite3.sqlite_version} WAL, file in a temp dir (aiosqlite {aiosqlite.__version__})"
    return env


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ratio(baseline: Any, shared: Any) -> str:
    if not isinstance(baseline, int | float) or not isinstance(shared, int | float) or not shared:
        return ""
    return f"{baseline / shared:,.1f}x"


def run_title(key: str) -> str:
    mode, waits = key.split("@")
    return f"{MODE_TITLES[mode]}, {int(waits):,}"


def print_table(summaries: dict[str, dict[str, Any]], env: dict[str, Any], config: dict[str, Any]) -> None:
    print(
        f"python {env['python']} on {env['platform']}; {env['cpu_count']} CPUs; "
        f"load average {env['load_average_1m']}; SQLAlchemy {env['sqlalchemy']}"
    )
    print(f"database: {env['database']}")
    sizes = " and ".join(f"{waits:,}" for waits in config["waits"])
    print(
        f"workload: {sizes} deferred waits in one event loop; {config['moving']:g} of the jobs (at most "
        f"{config['moving_max']:,}) moved queued -> pending -> running -> succeeded ({config['step_gap']:g} s apart) "
        f"by another process; the rest wait until the deadline ({config['seconds']:g} s); poll interval "
        f"{config['interval']:g} s"
    )
    for waits in config["waits"]:
        if waits > config["baseline_max"] and "baseline" in config["modes"]:
            print(
                f"baseline not run at {waits:,} waits (over --baseline-max {config['baseline_max']:,}): "
                f"it would need {waits:,} queries per interval, one per wait"
            )
    modes = list(summaries)
    rows: list[tuple[str, Callable[[dict[str, Any]], Any], bool]] = [
        ("wall time (s)", lambda s: s["wall_seconds"], False),
        ("store queries", lambda s: s["queries"], True),
        ("queries / s", lambda s: s["queries_per_second"], True),
        ("queries / interval (mean)", lambda s: s["queries_per_interval_mean"], True),
        ("queries / interval (median)", lambda s: s["queries_per_interval_median"], True),
        ("queries / interval (max)", lambda s: s["queries_per_interval_max"], True),
        ("each wait polled every (s)", lambda s: s["seconds_between_a_waits_polls"], False),
        ("SQL statements (BEGIN included)", lambda s: s["statements"], True),
        ("connections opened", lambda s: s["connections"], False),
        ("process CPU (s)", lambda s: s["cpu_seconds"], True),
        ("process CPU (% of one core)", lambda s: s["cpu_percent_of_one_core"], True),
        ("event-loop thread CPU (s)", lambda s: s["loop_thread_cpu_seconds"], True),
        ("event-loop lag p99 / max (ms)", lambda s: f"{s['loop_lag_p99_ms']:g} / {s['loop_lag_max_ms']:g}", False),
        (
            "stalls > 200 ms (at s: ms)",
            lambda s: " ".join(f"{at:g}:{ms}" for at, ms in s["loop_stalls_over_200ms"][:4]) or "none",
            False,
        ),
        ("  of which N connection lookups alone (ms)", lambda s: s["connection_lookup_stall_ms"], False),
        (
            "  full GC passes: count / longest (ms)",
            lambda s: f"{s['gc_full_collections']} / {s['gc_longest_full_collection_ms']}",
            False,
        ),
        ("write -> seen p50 (ms)", lambda s: s["latency_ms"]["p50"], False),
        ("write -> seen p90 (ms)", lambda s: s["latency_ms"]["p90"], False),
        ("write -> seen p99 (ms)", lambda s: s["latency_ms"]["p99"], False),
        ("write -> seen max (ms)", lambda s: s["latency_ms"]["max"], False),
        (
            "p50 pending / running / succeeded (ms)",
            lambda s: " / ".join(_fmt(s["latency_by_step_p50_ms"][step]) for step in STEPS),
            False,
        ),
        ("notifications seen / missed", lambda s: f"{s['latency_ms']['n']:,} / {s['missed_notifications']:,}", False),
        (
            "start -> first state p50 / max (ms)",
            lambda s: f"{_fmt(s['first_seen_ms']['p50'])} / {_fmt(s['first_seen_ms']['max'])}",
            False,
        ),
        ("events", lambda s: ", ".join(f"{k} {v:,}" for k, v in sorted(s["events"].items())) or "-", False),
        ("wrong events / errors", lambda s: f"{s['wrong_events']} / {sum(s['errors'].values())}", False),
        ("writer lag max (ms)", lambda s: s["writer_lag_ms"], False),
    ]
    width = max(len(label) for label, _, _ in rows) + 2
    header = f"{'':{width}}" + "".join(f"{run_title(mode):>30}" for mode in modes)
    pair = len(modes) == 2 and modes[0].startswith("shared@") and modes[1].startswith("baseline@")
    if pair:
        header += f"{'baseline / shared':>20}"
    print()
    print(header)
    for label, get, ratio in rows:
        values = [get(summaries[mode]) for mode in modes]
        line = f"{label:{width}}" + "".join(f"{_fmt(v):>30}" for v in values)
        if pair and ratio:
            line += f"{_ratio(values[1], values[0]):>20}"
        print(line)
    for mode in modes:
        if summaries[mode]["errors"]:
            print(f"errors ({run_title(mode)}): {summaries[mode]['errors']}")
        if summaries[mode]["pollers_left"]:
            print(f"pollers still registered after the waits ({run_title(mode)}): {summaries[mode]['pollers_left']}")


def goals(summaries: dict[str, dict[str, Any]], sizes: Sequence[int], interval: float) -> list[dict[str, Any]]:
    """Per size: far fewer queries than one per trigger (measured, or what it would need when the
    baseline was not run at that size) and the right events; over sizes: queries per interval constant."""
    checks = []
    for waits in sizes:
        shared, baseline = summaries.get(f"shared@{waits}"), summaries.get(f"baseline@{waits}")
        if shared is None:
            continue
        if baseline is not None:
            ratio = baseline["queries"] / shared["queries"] if shared["queries"] else float("inf")
            what = "than one per trigger"
        else:
            # One query per wait per interval, which the baseline could not even send at this size.
            needed = waits * shared["wall_seconds"] / interval
            ratio = needed / shared["queries"] if shared["queries"] else float("inf")
            what = "than one per trigger would need (not run)"
        checks.append(
            {
                "goal": f"{waits:,} waits: at least {GOAL_RATIO:g}x fewer queries {what}",
                "value": round(ratio, 1),
                "met": ratio >= GOAL_RATIO,
            }
        )
        checks.append(
            {
                "goal": f"{waits:,} waits: every wait ended with the right event, no errors",
                "value": f"{shared['wrong_events']} wrong, {sum(shared['errors'].values())} errors",
                "met": not shared["wrong_events"] and not shared["errors"],
            }
        )
    medians = {
        waits: summaries[f"shared@{waits}"]["queries_per_interval_median"]
        for waits in sizes
        if f"shared@{waits}" in summaries
    }
    if len(medians) > 1:
        smallest, largest = min(medians), max(medians)
        checks.append(
            {
                "goal": f"shared poller: queries per interval (median) at {largest:,} waits at most {smallest:,}'s + 1",
                "value": f"{medians[smallest]:g} -> {medians[largest]:g}",
                "met": medians[largest] <= medians[smallest] + 1,
            }
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--waits", default="5000", help="concurrent deferred waits; several sizes comma-separated: 5000,50000 (5000)"
    )
    parser.add_argument("--moving", type=float, default=0.2, help="fraction of the jobs the writer moves (0.2)")
    parser.add_argument(
        "--moving-max", type=int, default=1000, help="at most this many moving jobs: one writer process (1000)"
    )
    parser.add_argument("--seconds", type=float, default=25.0, help="waiting period: the waits' deadline (25)")
    parser.add_argument("--interval", type=float, default=1.0, help="poll interval in seconds (1)")
    parser.add_argument("--step-gap", type=float, default=3.0, help="seconds between one job's writes (3)")
    parser.add_argument("--modes", default=",".join(MODES), help="shared,baseline (default both)")
    parser.add_argument(
        "--baseline-max", type=int, default=5000, help="run the baseline only up to this many waits (5000)"
    )
    parser.add_argument("--postgres", action="store_true", help="a scratch database on 127.0.0.1:5432")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    try:
        sizes = [int(size.replace("_", "")) for size in args.waits.split(",") if size.strip()]
    except ValueError:
        parser.error(f"--waits: whole numbers, comma-separated (5000,50000), got {args.waits!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--waits: at least one size, each 1 or more, got {args.waits!r}")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    env = environment(args.postgres)
    summaries: dict[str, dict[str, Any]] = {}
    counters = Counters()
    with counters.installed():
        for waits in sizes:
            workload = Workload(
                waits=waits,
                moving=min(args.moving_max, round(waits * args.moving)),
                seconds=args.seconds,
                interval=args.interval,
                step_gap=args.step_gap,
                seed=args.seed,
            )
            for mode in modes:
                if mode == "baseline" and waits > args.baseline_max:
                    continue
                if not args.json:
                    print(f"running {MODE_TITLES[mode]} ({waits:,} waits) ...", file=sys.stderr, flush=True)
                result, admit_seconds = run_mode(mode, workload, args.postgres, counters)
                summaries[f"{mode}@{waits}"] = result.summary(workload.interval) | {
                    "admit_seconds": round(admit_seconds, 2)
                }
    config = {
        "waits": sizes,
        "moving": args.moving,
        "moving_max": args.moving_max,
        "seconds": args.seconds,
        "interval": args.interval,
        "step_gap": args.step_gap,
        "seed": args.seed,
        "modes": modes,
        "baseline_max": args.baseline_max,
        "database": "postgresql" if args.postgres else "sqlite",
    }
    checks = goals(summaries, sizes, args.interval)
    if args.json:
        print(json.dumps({"environment": env, "config": config, "results": summaries, "goals": checks}, indent=2))
    else:
        print_table(summaries, env, config)
        for check in checks:
            print(f"goal: {check['goal']}: {check['value']} -> {'met' if check['met'] else 'NOT met'}")
    return 0 if all(check["met"] for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

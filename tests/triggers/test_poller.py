"""The shared poller: every trigger of a triggerer process that watches one store shares one poll loop,
whose queries per interval do not grow with the number of waits, which releases its engine when the
last waiter leaves, and which survives a flaky store. Real triggers on a real SQLite store file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store import async_store
from iris_airflow_provider.store.async_store import AsyncFederationStore
from iris_airflow_provider.store.store import FederationStore
from iris_airflow_provider.triggers.federation import FederationJobTrigger
from iris_airflow_provider.triggers.poller import LOG_LINES_PER_QUERY, LogLines, Message, SharedJobPoller
from tests.postgres import scratch_database
from tests.triggers.conftest import (
    INTERVAL,
    hand_off,
    now_ms,
    promote,
    queue_job,
    report,
    route_log_to_stdlib,
    stays_false,
)
from tests.waiting import eventually


class Waits:
    """Real triggers, each consumed in its own task as the triggerer does; records what they log."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.events: dict[str, dict[str, Any]] = {}
        self.event_at: dict[str, float] = {}
        self.seen: dict[str, list[str]] = {}  # job id -> lines logged

    def start(self, job_id: str, *, interval: float = INTERVAL, **kwargs: Any) -> None:
        trigger = FederationJobTrigger(job_id, poll_interval=interval, **kwargs)
        route_log_to_stdlib(trigger)
        lines = self.seen.setdefault(job_id, [])
        trigger._log = _ListLogger(lines, trigger._log)
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._consume(job_id, trigger))

    async def _consume(self, job_id: str, trigger: FederationJobTrigger) -> None:
        async for event in trigger.run():
            self.events[job_id] = event.payload
            self.event_at[job_id] = time.monotonic()

    def heard(self, job_id: str) -> bool:
        return bool(self.seen.get(job_id))

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


class _ListLogger:
    def __init__(self, lines: list[str], inner: logging.Logger) -> None:
        self.lines = lines
        self.inner = inner

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args if args else message)
        self.inner.info(message, *args)


@pytest.fixture
async def waits():
    started = Waits()
    yield started
    await started.stop()


def the_poller() -> SharedJobPoller:
    pollers = list(SharedJobPoller._pollers.values())
    assert len(pollers) == 1, pollers
    return pollers[0]


async def test_triggers_watching_one_store_share_one_poller(store, waits):
    for index in range(5):
        queue_job(store, f"/alice/job-{index}")
    for index in range(5):
        waits.start(f"/alice/job-{index}")
    waits.start("/alice/job-0", until="accepted")  # a second waiter on the same job
    await eventually(lambda: all(waits.heard(f"/alice/job-{index}") for index in range(5)), what="every first state")
    poller = the_poller()
    assert set(poller.watchers) == {f"/alice/job-{index}" for index in range(5)}
    assert len(poller.watchers["/alice/job-0"]) == 2
    promote(store, "/alice/job-0")
    hand_off(store, "/alice/job-0")
    await eventually(lambda: "/alice/job-0" in waits.events, what="the acceptance")
    assert len(poller.watchers["/alice/job-0"]) == 1  # the other waiter on that job still waits
    report(store, "/alice/job-0", JobState.SUCCEEDED, exit_code=0)
    await eventually(lambda: waits.tasks["/alice/job-0"].done() and len(poller.watchers) == 4, what="the end")
    assert "/alice/job-0" not in poller.latest  # nothing kept for a job nobody watches
    assert the_poller() is poller


async def test_queries_per_poll_do_not_grow_with_the_number_of_waits(store, waits):
    window = 12 * INTERVAL
    queries_in_window: dict[int, int] = {}
    for count in (1, 200):
        job_ids = [f"/alice/n{count}-{index:03d}" for index in range(count)]
        for job_id in job_ids:
            queue_job(store, job_id)
        for job_id in job_ids:
            waits.start(job_id)
        await eventually(lambda ids=job_ids: all(waits.heard(job_id) for job_id in ids), what=f"{count} first states")
        poller = the_poller()
        before, polls_before = poller.queries, poller.polls
        await asyncio.sleep(window / 2)
        for job_id in job_ids[:3]:  # the store keeps changing meanwhile
            promote(store, job_id)
        await asyncio.sleep(window / 2)
        queries_in_window[count] = poller.queries - before
        assert poller.queries - before == poller.polls - polls_before  # one query per poll, for every waiter
        await eventually(lambda ids=job_ids: all(len(waits.seen[job_id]) == 2 for job_id in ids[:3]), what="changes")
        await waits.stop()
        waits.tasks.clear()
        assert SharedJobPoller._pollers == {}
    intervals = window / INTERVAL
    for count, queries in queries_in_window.items():
        assert 3 <= queries <= intervals + 2, (count, queries, intervals)
    assert queries_in_window[200] <= queries_in_window[1] + 2, queries_in_window


async def test_a_burst_of_new_waiters_costs_a_few_queries_not_one_each(store, waits):
    job_ids = [f"/alice/burst-{index:03d}" for index in range(300)]
    for job_id in job_ids:
        queue_job(store, job_id)
    for job_id in job_ids:
        waits.start(job_id, interval=60)
    await eventually(lambda: all(waits.heard(job_id) for job_id in job_ids), what="every first state")
    # The waiters' start-up spreads over a few event-loop steps: a batch or two, and one query for changes.
    assert the_poller().queries <= 4


async def test_a_new_waiter_hears_about_its_job_at_once_even_while_a_poll_is_running(store, waits, monkeypatch):
    """The interval here is a minute: the first state must not wait for it. The second job was last
    written long ago, so no query for recent changes brings it along by chance."""
    queue_job(store, "/alice/first")
    queue_job(store, "/alice/second", at_ms=now_ms() - 3_600_000)
    fetching = asyncio.Event()
    original = AsyncFederationStore.snapshots

    async def slow(self, job_ids):
        fetching.set()
        await asyncio.sleep(0.3)
        return await original(self, job_ids)

    monkeypatch.setattr(AsyncFederationStore, "snapshots", slow)
    started = time.monotonic()
    waits.start("/alice/first", interval=60)
    await fetching.wait()
    waits.start("/alice/second", interval=60)  # subscribes while the first one's fetch is running
    await eventually(lambda: waits.heard("/alice/first") and waits.heard("/alice/second"), timeout=3, what="both")
    assert time.monotonic() - started < 2
    assert waits.seen["/alice/second"] == [f"Job /alice/second is pending (handoff queued): {reasons.QUEUED_UNPINNED}"]


async def test_the_poller_disposes_its_engine_when_the_last_waiter_leaves(store, waits, monkeypatch):
    disposed: list[AsyncFederationStore] = []
    disposed_at: list[float] = []
    original = AsyncFederationStore.dispose

    async def counting(self):
        await original(self)
        disposed.append(self)
        disposed_at.append(time.monotonic())

    monkeypatch.setattr(AsyncFederationStore, "dispose", counting)
    for job_id in ("/alice/a", "/alice/b", "/alice/c"):
        queue_job(store, job_id)
    waits.start("/alice/a")
    waits.start("/alice/b")
    await eventually(lambda: waits.heard("/alice/a") and waits.heard("/alice/b"), what="first states")
    poller = the_poller()
    store.request_cancel("/alice/a", int(time.time() * 1000))
    await eventually(lambda: "/alice/a" in waits.events, what="a's event")
    assert disposed == [] and the_poller() is poller
    store.request_cancel("/alice/b", int(time.time() * 1000))
    await eventually(lambda: waits.tasks["/alice/b"].done(), what="b's event")
    assert disposed == [poller.store]
    assert disposed_at[0] <= waits.event_at["/alice/b"]  # before the event: nothing left open in the triggerer
    assert SharedJobPoller._pollers == {}
    assert poller.task is not None and poller.task.done()
    assert poller.store.engine.pool.checkedout() == 0

    # A new wait afterwards gets a new poller, which works.
    waits.start("/alice/c")
    await eventually(lambda: waits.heard("/alice/c"), what="c's first state")
    assert the_poller() is not poller
    store.request_cancel("/alice/c", int(time.time() * 1000))
    await eventually(lambda: "/alice/c" in waits.events, what="c's event")
    assert waits.events["/alice/c"]["state"] == "killed"
    assert len(disposed) == 2


class TestAFlakyStore:
    async def test_a_failed_query_for_changes_does_not_end_the_waits(self, store, waits, monkeypatch, caplog):
        queue_job(store, "/alice/flaky")
        waits.start("/alice/flaky")
        await eventually(lambda: waits.heard("/alice/flaky"), what="the first state")
        failures = {"left": 3}
        original = AsyncFederationStore.changed_since

        async def flaky(self, since):
            if failures["left"]:
                failures["left"] -= 1
                self.queries += 1
                raise sa.exc.OperationalError("SELECT ...", {}, Exception("database is locked"))
            return await original(self, since)

        monkeypatch.setattr(AsyncFederationStore, "changed_since", flaky)
        await eventually(lambda: failures["left"] == 0, what="three failed polls")
        promote(store, "/alice/flaky")
        await eventually(lambda: len(waits.seen["/alice/flaky"]) == 2, what="the change after the failures")
        assert "Awaiting acceptance by peer cw-h100" in waits.seen["/alice/flaky"][1]
        assert not waits.tasks["/alice/flaky"].done()
        warnings = [r for r in caplog.records if r.getMessage() == "Polling the federation store failed; retrying"]
        assert len(warnings) == 3 and all(r.levelno == logging.WARNING for r in warnings)

    async def test_a_failed_first_fetch_is_retried_not_forgotten(self, store, waits, monkeypatch):
        """Without a retry a new waiter would hear nothing until its job changed or a full refresh."""
        queue_job(store, "/alice/unlucky")
        failures = {"left": 1}
        original = AsyncFederationStore.snapshots

        async def flaky(self, job_ids):
            if failures["left"]:
                failures["left"] -= 1
                raise sa.exc.OperationalError("SELECT ...", {}, Exception("server closed the connection"))
            return await original(self, job_ids)

        monkeypatch.setattr(AsyncFederationStore, "snapshots", flaky)
        waits.start("/alice/unlucky")
        await eventually(lambda: waits.heard("/alice/unlucky"), timeout=2, what="the first state after a retry")
        assert failures["left"] == 0

    async def test_a_store_that_is_down_for_a_while_delays_the_waits_but_ends_none(self, store, waits, monkeypatch):
        queue_job(store, "/alice/patient")
        waits.start("/alice/patient", until="accepted")
        await eventually(lambda: waits.heard("/alice/patient"), what="the first state")
        down = {"yes": True}
        changed_since, snapshots = AsyncFederationStore.changed_since, AsyncFederationStore.snapshots

        refused: list[int] = []

        async def refuse(*_: Any) -> Any:
            refused.append(1)
            raise OSError("connection refused")

        def while_down(method: Any) -> Any:
            return lambda self, arg: refuse() if down["yes"] else method(self, arg)

        monkeypatch.setattr(AsyncFederationStore, "changed_since", while_down(changed_since))
        monkeypatch.setattr(AsyncFederationStore, "snapshots", while_down(snapshots))
        await eventually(lambda: refused, what="a refused poll")  # no query from before the outage in flight
        promote(store, "/alice/patient")
        hand_off(store, "/alice/patient")
        await stays_false(lambda: waits.tasks["/alice/patient"].done(), 10 * INTERVAL)
        down["yes"] = False
        await eventually(lambda: "/alice/patient" in waits.events, what="the acceptance once the store is back")
        assert waits.events["/alice/patient"]["status"] == "reached"


async def test_large_batches_are_split_into_several_queries(store, store_url, monkeypatch):
    """The first fetch of a burst of waiters, and the full refresh, name every job: asyncpg refuses
    statements with more than 32,767 parameters."""
    monkeypatch.setattr(async_store, "MAX_IDS_PER_QUERY", 4)
    job_ids = [f"/alice/chunk-{index}" for index in range(9)]
    for job_id in job_ids:
        queue_job(store, job_id)
    reader = AsyncFederationStore(f"sqlite+aiosqlite:///{store_url.removeprefix('sqlite:///')}")
    try:
        found = await reader.snapshots([*job_ids, "/alice/missing", job_ids[0]])
    finally:
        await reader.dispose()
    assert sorted(found) == sorted(job_ids)
    assert reader.queries == 3  # 10 distinct ids, 4 per query


async def test_a_poller_left_on_a_closed_event_loop_is_not_reused(store_url):
    loop = asyncio.get_running_loop()
    stale = SharedJobPoller.for_store(store_url, 1.0)
    stale.loop = asyncio.new_event_loop()  # as if registered by a closed loop whose id this one now has
    stale.loop.close()
    fresh = SharedJobPoller.for_store(store_url, 1.0)
    try:
        assert fresh is not stale and fresh.loop is loop
        assert SharedJobPoller._pollers[(id(loop), store_url, 1.0)] is fresh
    finally:
        await stale.store.dispose()
        await fresh.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request, store, store_url) -> Iterator[tuple[FederationStore, str]]:
    """The store and its URL: the SQLite file of ``store``, or a scratch PostgreSQL database."""
    if request.param == "sqlite":
        yield store, store_url
        return
    with scratch_database("iris_relay") as url:
        postgres = FederationStore.from_url(url)
        postgres.migrate()
        try:
            yield postgres, url
        finally:
            postgres.dispose()


async def relayed_until(queue: asyncio.Queue[Message], lines: list[str], done: Callable[[], bool]) -> None:
    """Collect the output handed to this waiter until ``done()``."""

    async def collect() -> None:
        while not done():
            message = await queue.get()
            if isinstance(message, LogLines):
                lines.extend(message.lines)

    try:
        await asyncio.wait_for(collect(), timeout=5)
    except TimeoutError:
        pytest.fail(f"output still missing after 5 s; relayed so far: {len(lines)} lines, the last {lines[-3:]}")


async def test_a_jobs_new_output_is_relayed_even_behind_more_than_a_reads_worth_of_another_jobs(any_store):
    """Each job is read from its own last relayed line. Read from the smallest of them (both jobs have
    new output at once), the quiet job's new line would sit behind the chatty job's 2,000+ lines
    relayed already, which filled every read: neither job's new line would ever be relayed."""
    store, url = any_store
    quiet, chatty = queue_job(store, "/alice/quiet"), queue_job(store, "/alice/chatty")
    assert store.append_logs(quiet.job_id, quiet.nonce, ["quiet 1"], "q1", now_ms())
    chatter = [f"chatty {index}" for index in range(LOG_LINES_PER_QUERY + 100)]
    assert store.append_logs(chatty.job_id, chatty.nonce, chatter, "c1", now_ms())
    poller = SharedJobPoller.for_store(url, INTERVAL)
    quiet_queue, chatty_queue = poller.subscribe(quiet.job_id), poller.subscribe(chatty.job_id)
    quiet_lines: list[str] = []
    chatty_lines: list[str] = []
    try:
        await relayed_until(chatty_queue, chatty_lines, lambda: len(chatty_lines) >= len(chatter))
        await relayed_until(quiet_queue, quiet_lines, lambda: quiet_lines == ["quiet 1"])
        # No await in between: the next poll finds both jobs with new output.
        assert store.append_logs(quiet.job_id, quiet.nonce, ["quiet 2"], "q2", now_ms())
        assert store.append_logs(chatty.job_id, chatty.nonce, ["chatty more"], "c2", now_ms())
        await relayed_until(quiet_queue, quiet_lines, lambda: len(quiet_lines) >= 2)
        await relayed_until(chatty_queue, chatty_lines, lambda: len(chatty_lines) > len(chatter))
        await asyncio.sleep(5 * INTERVAL)  # a few more polls: nothing is handed over twice
        while not quiet_queue.empty() or not chatty_queue.empty():
            for queue, lines in ((quiet_queue, quiet_lines), (chatty_queue, chatty_lines)):
                if not queue.empty() and isinstance(message := queue.get_nowait(), LogLines):
                    lines.extend(message.lines)
    finally:
        await poller.unsubscribe(quiet.job_id, quiet_queue)
        await poller.unsubscribe(chatty.job_id, chatty_queue)
    assert quiet_lines == ["quiet 1", "quiet 2"]
    assert chatty_lines == [*chatter, "chatty more"]


async def test_output_of_more_jobs_than_one_query_names_is_read_in_several_queries_none_skipped(
    store, store_url, monkeypatch
):
    """Up to 10,000 jobs per query (asyncpg's parameter limit; 4 here): every waited-on job with new
    output is read, in one poll, none left out because its id did not fit in the first query."""
    monkeypatch.setattr(async_store, "MAX_IDS_PER_QUERY", 4)
    jobs = [queue_job(store, f"/alice/out-{index}") for index in range(9)]
    poller = SharedJobPoller.for_store(store_url, 60)  # one poll in this test: the subscribers' first fetch
    queues = {job.job_id: poller.subscribe(job.job_id) for job in jobs}
    try:
        await eventually(lambda: len(poller.latest) == len(jobs), what="every job's first state")
        # From here the test polls by hand: no poll of the loop's may run alongside and relay first.
        assert poller.task is not None
        poller.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller.task
        await poller.poll_once()  # whatever the loop's first poll left undone
        for job in jobs:
            assert store.append_logs(job.job_id, job.nonce, [f"{job.job_id} line"], "c1", now_ms())
        before = poller.queries
        await poller.poll_once()
        relayed: dict[str, list[str]] = {}
        for job_id, queue in queues.items():
            while not queue.empty():
                if isinstance(message := queue.get_nowait(), LogLines):
                    relayed.setdefault(job_id, []).extend(message.lines)
        assert relayed == {job.job_id: [f"{job.job_id} line"] for job in jobs}
        for job in jobs:
            assert poller.log_positions[job.job_id] == store.get_job(job.job_id).last_log_seq
        assert poller.queries - before == 1 + 3  # the query for changes, then 9 jobs' output in 3 queries
    finally:
        for job_id, queue in queues.items():
            await poller.unsubscribe(job_id, queue)

"""One poll loop per store for every waiting trigger of a triggerer process.

Thousands of deferred tasks may wait on federated jobs in one triggerer. Polling once per trigger
would send thousands of queries per interval; instead every trigger subscribes to a shared poller,
which per interval asks the store only for what changed (``updated_at_ms`` at or after its
watermark, less a margin for writers' clock skew and late commits), and refreshes everything now
and then as a safety net. Queries per interval do not grow with the number of waits. The same
poll relays the jobs' output: when a job's newest relayed line moves, its new lines are read from its
own last relayed line, for up to 10,000 such jobs per query, and handed to its waiters.

A new waiter hears about its job at once, not one interval later: waiters that subscribe together
(or while a poll is running) are fetched in one batch shortly after, without an extra query for
changes. A failed poll loses nothing: the batch is fetched again, and after the first read the
watermark only moves on what a successful query for changes returned. Publishing to thousands of waiters yields to the
event loop every few hundred, so the other triggers of the process keep running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from iris_airflow_provider.store.async_store import AsyncFederationStore, JobSnapshot

log = logging.getLogger(__name__)

CLOCK_SKEW_MARGIN_MS = 10_000
FULL_REFRESH_SECONDS = 60.0
SUBSCRIBE_BATCH_SECONDS = 0.05  # new waiters arriving within this long share one fetch
PUBLISH_CHUNK = 250  # waiters woken per event-loop step
MISSING = None  # published when a watched job is not in the store
LOG_LINES_PER_QUERY = 2000  # relayed output read per query, for up to 10,000 waited-on jobs together


@dataclass(frozen=True, slots=True)
class LogLines:
    """New output of a watched job (of its current incarnation), in order."""

    job_id: str
    lines: tuple[str, ...]
    up_to_seq: int  # every line of the job up to here has now been handed over


Message = JobSnapshot | LogLines | None


class SharedJobPoller:
    _pollers: ClassVar[dict[tuple[int, str, float], SharedJobPoller]] = {}

    def __init__(
        self,
        url: str,
        interval: float,
        *,
        store_factory: Callable[[str], AsyncFederationStore] = AsyncFederationStore,
    ) -> None:
        self.url = url
        self.interval = interval
        self.store = store_factory(url)
        self.loop = asyncio.get_running_loop()
        self.watchers: dict[str, list[asyncio.Queue[Message]]] = {}
        self.latest: dict[str, JobSnapshot] = {}
        self.unfetched: set[str] = set()
        self.log_positions: dict[str, int] = {}  # per watched job: the last output line relayed
        self.watermark_ms: int | None = None
        self.last_full_refresh = time.monotonic()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.polls = 0

    @classmethod
    def for_store(cls, url: str, interval: float) -> SharedJobPoller:
        """The poller of this event loop for ``url`` at ``interval`` (created on first use)."""
        loop = asyncio.get_running_loop()
        key = (id(loop), url, interval)
        poller = cls._pollers.get(key)
        if poller is None or poller.loop is not loop:  # ids of closed loops are reused
            poller = cls._pollers[key] = cls(url, interval)
        return poller

    @property
    def queries(self) -> int:
        return self.store.queries

    def subscribe(self, job_id: str, *, after_seq: int = 0) -> asyncio.Queue[Message]:
        """A queue of the job's snapshots and new output; ``after_seq``: its output up to that line was
        already relayed to this waiter (a task deferred again in the same try)."""
        queue: asyncio.Queue[Message] = asyncio.Queue()
        if after_seq and job_id not in self.watchers:
            self.log_positions[job_id] = after_seq
        self.watchers.setdefault(job_id, []).append(queue)
        if job_id in self.latest:
            queue.put_nowait(self.latest[job_id])
            if job_id in self.log_positions:  # output already handed to another waiter is not sent again
                queue.put_nowait(LogLines(job_id, (), self.log_positions[job_id]))
        else:
            self.unfetched.add(job_id)
            self.wakeup.set()  # a new waiter hears about its job at once, not one interval later
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name=f"iris-federation-poller {self.url}")
        return queue

    async def unsubscribe(self, job_id: str, queue: asyncio.Queue[Message]) -> None:
        queues = self.watchers.get(job_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self.watchers.pop(job_id, None)
            self.latest.pop(job_id, None)
            self.log_positions.pop(job_id, None)
            self.unfetched.discard(job_id)
        if not self.watchers:
            await self.close()

    async def close(self) -> None:
        """Stop polling and release the store's connections (before the last waiter yields its event)."""
        for key, poller in list(self._pollers.items()):
            if poller is self:
                del self._pollers[key]
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.store.dispose()

    async def _run(self) -> None:
        next_changes = time.monotonic()  # when the next query for changes is due
        while self.watchers:
            changes = time.monotonic() >= next_changes
            if changes or self.unfetched:
                if changes:
                    next_changes = time.monotonic() + self.interval
                try:
                    await self.poll_once(changes=changes)
                except Exception:  # a flaky store must not kill every wait; the next poll retries
                    log.warning("Polling the federation store failed; retrying", exc_info=True)
                    await asyncio.sleep(max(0.0, next_changes - time.monotonic()))
                    continue
            if not self.unfetched:
                # Subscribing adds to ``unfetched`` and sets the event in one step: nothing is missed.
                self.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), max(0.0, next_changes - time.monotonic()))
            if self.unfetched:
                # Waiters start in bursts (a triggerer picks up many at once): fetch them together.
                await asyncio.sleep(min(SUBSCRIBE_BATCH_SECONDS, max(0.0, next_changes - time.monotonic())))

    async def poll_once(self, *, changes: bool = True) -> None:
        """Fetch newly watched jobs; with ``changes``, also the jobs written since the watermark (less the
        margin), or every watched job when a full refresh is due."""
        self.polls += 1
        if self.unfetched:
            batch, self.unfetched = sorted(self.unfetched), set()
            try:
                await self._fetch(batch)
            except BaseException:
                self.unfetched.update(job_id for job_id in batch if job_id in self.watchers)
                raise
        if changes and self.watchers:
            if time.monotonic() - self.last_full_refresh >= FULL_REFRESH_SECONDS:
                self.last_full_refresh = time.monotonic()
                await self._fetch(sorted(self.watchers))
            elif self.watermark_ms is not None:
                changed = await self.store.changed_since(self.watermark_ms - CLOCK_SKEW_MARGIN_MS)
                for snapshot in changed:
                    self.watermark_ms = max(self.watermark_ms, snapshot.updated_at_ms)
                await self._publish_all((snapshot.job_id, snapshot) for snapshot in changed)
        await self._relay_logs()

    async def _relay_logs(self) -> None:
        """Hand new output to the waiters of jobs whose newest relayed line moved: every such job read
        from its own last relayed line, up to 10,000 jobs per query."""
        due = {
            job_id: self.log_positions.get(job_id, 0)
            for job_id, snapshot in self.latest.items()
            if snapshot.last_log_seq > self.log_positions.get(job_id, 0) and job_id in self.watchers
        }
        if not due:
            return
        rows, caught_up = await self.store.log_lines(due, limit=LOG_LINES_PER_QUERY)
        fresh: dict[str, list[str]] = {}
        for seq, job_id, nonce, line in rows:
            if job_id not in self.latest:  # its last waiter left while the lines were read
                continue
            if nonce == self.latest[job_id].nonce:  # not an earlier run's output
                fresh.setdefault(job_id, []).append(line)
            self.log_positions[job_id] = max(self.log_positions.get(job_id, 0), seq)
        for job_id in caught_up & self.latest.keys():  # nothing older is left behind for these
            self.log_positions[job_id] = max(self.log_positions.get(job_id, 0), self.latest[job_id].last_log_seq)
        for job_id in due.keys() & self.latest.keys():
            message = LogLines(job_id, tuple(fresh.get(job_id, ())), self.log_positions.get(job_id, 0))
            for queue in self.watchers.get(job_id, []):
                queue.put_nowait(message)

    async def _fetch(self, job_ids: list[str]) -> None:
        """Read these jobs and publish them (``MISSING`` for a job not in the store)."""
        found = await self.store.snapshots(job_ids)
        if self.watermark_ms is None:
            # The first read starts the watermark, on the writers' clocks. Later reads leave it alone:
            # moving it to a newer job's stamp could skip changes not yet seen (after an outage).
            stamps = [snapshot.updated_at_ms for snapshot in found.values()]
            self.watermark_ms = max(stamps) if stamps else int(time.time() * 1000)
        await self._publish_all((job_id, found.get(job_id)) for job_id in job_ids)

    async def _publish_all(self, items: Iterable[tuple[str, JobSnapshot | None]]) -> None:
        woken = 0
        for job_id, snapshot in items:
            woken += self._publish(job_id, snapshot)
            if woken >= PUBLISH_CHUNK:
                woken = 0
                await asyncio.sleep(0)  # let the woken waiters run before waking more

    def _publish(self, job_id: str, snapshot: JobSnapshot | None) -> int:
        """Hand a snapshot to the job's waiters unless they have it already; returns how many were woken."""
        queues = self.watchers.get(job_id)
        if not queues:
            return 0  # nobody waits on it (any more)
        if snapshot is not None:
            self.unfetched.discard(job_id)  # a query for changes may bring a new waiter's job first
            previous = self.latest.get(job_id)
            if previous is not None and snapshot.row_version <= previous.row_version:
                return 0
            self.latest[job_id] = snapshot
        for queue in queues:
            queue.put_nowait(snapshot)
        return len(queues)

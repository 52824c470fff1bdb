"""One poll loop per store for every waiting trigger of a triggerer process.

Thousands of deferred tasks may wait on federated jobs in one triggerer. Polling once per trigger
would send thousands of queries per interval; instead every trigger subscribes to a shared poller,
which per interval asks the store only for what changed (``updated_at_ms`` at or after its
watermark, less a margin for writers' clock skew and late commits), fetches newly watched jobs in
one batch, and refreshes everything now and then as a safety net. Queries per interval do not
grow with the number of waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import ClassVar

from iris_airflow_provider.store.async_store import AsyncFederationStore, JobSnapshot

log = logging.getLogger(__name__)

CLOCK_SKEW_MARGIN_MS = 10_000
FULL_REFRESH_SECONDS = 60.0
MISSING = None  # published when a watched job is not in the store


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
        self.watchers: dict[str, list[asyncio.Queue[JobSnapshot | None]]] = {}
        self.latest: dict[str, JobSnapshot] = {}
        self.unfetched: set[str] = set()
        self.watermark_ms: int | None = None
        self.last_full_refresh = time.monotonic()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.polls = 0

    @classmethod
    def for_store(cls, url: str, interval: float) -> SharedJobPoller:
        """The poller of this event loop for ``url`` at ``interval`` (created on first use)."""
        key = (id(asyncio.get_running_loop()), url, interval)
        poller = cls._pollers.get(key)
        if poller is None:
            poller = cls._pollers[key] = cls(url, interval)
        return poller

    @property
    def queries(self) -> int:
        return self.store.queries

    def subscribe(self, job_id: str) -> asyncio.Queue[JobSnapshot | None]:
        queue: asyncio.Queue[JobSnapshot | None] = asyncio.Queue()
        self.watchers.setdefault(job_id, []).append(queue)
        if job_id in self.latest:
            queue.put_nowait(self.latest[job_id])
        else:
            self.unfetched.add(job_id)
            self.wakeup.set()  # a new waiter hears about its job at once, not one interval later
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"iris-federation-poller {self.url}")
        return queue

    async def unsubscribe(self, job_id: str, queue: asyncio.Queue[JobSnapshot | None]) -> None:
        queues = self.watchers.get(job_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self.watchers.pop(job_id, None)
            self.latest.pop(job_id, None)
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
        while self.watchers:
            try:
                await self.poll_once()
            except Exception:  # a flaky store must not kill every wait; the next poll retries
                log.warning("Polling the federation store failed; retrying", exc_info=True)
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), self.interval)

    async def poll_once(self) -> None:
        self.polls += 1
        if self.unfetched:
            batch, self.unfetched = sorted(self.unfetched), set()
            found = await self.store.snapshots(batch)
            for job_id in batch:
                self._publish(job_id, found.get(job_id))
        if time.monotonic() - self.last_full_refresh >= FULL_REFRESH_SECONDS and self.watchers:
            self.last_full_refresh = time.monotonic()
            found = await self.store.snapshots(sorted(self.watchers))
            for job_id in list(self.watchers):
                self._publish(job_id, found.get(job_id))
        elif self.watermark_ms is not None:
            for snapshot in await self.store.changed_since(self.watermark_ms - CLOCK_SKEW_MARGIN_MS):
                self.watermark_ms = max(self.watermark_ms, snapshot.updated_at_ms)
                if snapshot.job_id in self.watchers:
                    self._publish(snapshot.job_id, snapshot)

    def _publish(self, job_id: str, snapshot: JobSnapshot | None) -> None:
        if snapshot is not None:
            if self.watermark_ms is None or snapshot.updated_at_ms > self.watermark_ms:
                self.watermark_ms = snapshot.updated_at_ms
            previous = self.latest.get(job_id)
            if previous is not None and previous.row_version == snapshot.row_version:
                return
            self.latest[job_id] = snapshot
        elif self.watermark_ms is None:
            self.watermark_ms = int(time.time() * 1000)
        for queue in self.watchers.get(job_id, []):
            queue.put_nowait(snapshot)

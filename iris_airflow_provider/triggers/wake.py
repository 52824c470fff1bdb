"""Wakes the placement DAG when there is work for it (event-driven scheduling through an asset).

The placement DAG runs on a fixed period and also on this trigger's events: a job was queued,
resubmitted or cancelled (so a queued job is placed within seconds when capacity is free), the
task waiting on a job was killed (so the tick checks at once whether that task gave the job up),
or jobs are in flight and the last wake is older than the sync interval (so their state, and freed
capacity, are picked up promptly). Idle, it costs one small indexed query per poll (plus one per
sync interval) and wakes nothing. It polls every second: the wait for the next poll is part of
every job's submit-to-promotion time (``bench/latency_bench.py``: the ``wake`` step). Polling four
times a second saved about 0.3 s there, but on a SQLite metadata database (the demo) its more
frequent asset events once held the database long enough for a REST call to fail "database is
locked", so it is not the default.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from iris_airflow_provider.core.orphans import TASK_KILLED
from iris_airflow_provider.hooks.federation_store import FederationStoreHook, open_store
from iris_airflow_provider.store.async_store import AsyncFederationStore

# A killed task's event wakes it too: its orphan check then reads the task's state (core.orphans).
WAKE_EVENT_KINDS = ("admitted", "resubmitted", "cancel_requested", TASK_KILLED)


class FederationWakeTrigger(BaseEventTrigger):
    def __init__(
        self,
        *,
        conn_id: str = FederationStoreHook.default_conn_name,
        poll_interval: float = 1.0,
        sync_interval: float = 10.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger is untyped
        self.conn_id = conn_id
        self.poll_interval = float(poll_interval)
        self.sync_interval = float(sync_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"conn_id": self.conn_id, "poll_interval": self.poll_interval, "sync_interval": self.sync_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = FederationStoreHook(self.conn_id)
        # This trigger may start before anything else touched the store: create its schema first
        # (off the event loop; Alembic is synchronous).
        await asyncio.to_thread(open_store, hook.get_url())
        store = AsyncFederationStore(await hook.aget_url())
        try:
            seen = await store.latest_event_seq(WAKE_EVENT_KINDS)
            last_wake = 0.0
            while True:
                await asyncio.sleep(self.poll_interval)
                try:
                    reason, seen = await self._reason(store, seen, last_wake)
                except Exception:  # the store may be restarting; wakes resume when it is back
                    self.log.warning("Reading the federation store failed; retrying", exc_info=True)
                    continue
                if reason:
                    last_wake = time.monotonic()
                    yield TriggerEvent({"reason": reason, "event_seq": seen, "at_ms": int(time.time() * 1000)})
        finally:
            await store.dispose()

    async def _reason(self, store: AsyncFederationStore, seen: int, last_wake: float) -> tuple[str, int]:
        newest = await store.latest_event_seq(WAKE_EVENT_KINDS)
        if newest > seen:
            return "a job was queued, resubmitted or cancelled, or its task was killed", newest
        if time.monotonic() - last_wake >= self.sync_interval and await store.in_flight_count():
            return "jobs are in flight", seen
        return "", seen

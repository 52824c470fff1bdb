"""Expiry: queued jobs past their scheduling deadline end unschedulable (the rule is
:mod:`iris_airflow_provider.core.expiry`), in one conditional update per batch of jobs.

Each row keeps its own condition: still queued, and still the incarnation whose deadline was read
(the same deadline), so a job promoted, cancelled or resubmitted meanwhile is left alone.
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa

from iris_airflow_provider.core.expiry import Expiry, expiries
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.common import StoreBase, chunked, event_row, events, queued, touched
from iris_airflow_provider.store.schema import jobs


class Expiries(StoreBase):
    def expire_queued(self, now_ms: int) -> list[str]:
        """Queued jobs past their deadline (:func:`~iris_airflow_provider.core.expiry.expiries`) become
        unschedulable; they can never be promoted after. Returns their ids, sorted."""
        # Only rows already past the deadline are read (the rule as a filter, so a tick over a large
        # queue does not carry every deadline into Python); the core decides on what comes back.
        candidates = sa.select(jobs.c.job_id, jobs.c.scheduling_deadline_ms).where(
            queued(), jobs.c.scheduling_deadline_ms < now_ms
        )
        with self._read() as connection:
            due = expiries(((row[0], row[1]) for row in connection.execute(candidates)), now_ms)
        if not due:
            return []  # the common case, on every tick: no write lock taken
        by_error: dict[str, list[Expiry]] = defaultdict(list)
        for expiry in due:
            by_error[expiry.error].append(expiry)
        peers: dict[str, str] = {}  # expired job id -> its peer id
        with self._write() as connection:
            for error, group in by_error.items():
                for batch in chunked(group):
                    same_incarnation = sa.tuple_(jobs.c.job_id, jobs.c.scheduling_deadline_ms).in_(
                        [(expiry.job_id, expiry.scheduling_deadline_ms) for expiry in batch]
                    )
                    rows = connection.execute(
                        jobs.update()
                        .where(same_incarnation, queued())
                        .values(
                            state=JobState.UNSCHEDULABLE.value, error=error, finished_at_ms=now_ms, **touched(now_ms)
                        )
                        .returning(jobs.c.job_id, jobs.c.peer_id)
                    )
                    peers.update((job_id, peer_id) for job_id, peer_id in rows)
            expired = [expiry.job_id for expiry in due if expiry.job_id in peers]
            events(
                connection,
                [
                    event_row(job_id, now_ms, "expired", JobState.UNSCHEDULABLE, HandoffState.QUEUED, peers[job_id])
                    for job_id in expired
                ],
            )
        return expired

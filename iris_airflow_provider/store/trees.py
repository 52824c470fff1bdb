"""Job trees: admitting a child under a live parent, cancelling a whole tree, finding orphans.

A child is admitted only while its parent's incarnation is live and uncancelled, and the check and
the insert are one transaction that first writes the parent's row: a cancel of the parent writes
that row too, so the two serialize. Either the child is in before the cancel, and the cancel (whose
descendant scan runs after its own write of the parent, in its transaction) finds and cancels it;
or the cancel is in first, and the child is refused. A child whose parent ended without a cancel
(succeeded or failed) is found by :meth:`Trees.live_children` and killed by the tick.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store.common import StoreBase, event, insert, not_terminal, supersede, touched
from iris_airflow_provider.store.jobs import incarnation, request_cancel
from iris_airflow_provider.store.records import CancelOutcome, JobRecord, NewIncarnation
from iris_airflow_provider.store.schema import jobs


class ParentNotLiveError(Exception):
    """The parent incarnation has ended, was replaced, or is being cancelled: it takes no children."""


@dataclass(frozen=True, slots=True)
class ChildAdmission:
    job: JobRecord
    created: bool  # False: a live child with this id already existed and is returned as it is


def _below(key: str) -> sa.ColumnElement[bool]:
    """Jobs in the tree below ``key`` (an exact prefix: job ids hold ``_`` and ``%`` is no wildcard here)."""
    prefix = key + "/"
    return sa.func.substr(jobs.c.job_id, 1, len(prefix)) == prefix


class Trees(StoreBase):
    def admit_child(self, new: NewIncarnation, parent_key: str, parent_nonce: str, now_ms: int) -> ChildAdmission:
        """Admit ``new`` (a child of ``parent_key``) while incarnation ``parent_nonce`` of its parent is
        live and uncancelled; a finished child of the same id runs again as a new incarnation, a live
        one is returned as it is. ParentNotLiveError otherwise, with nothing written."""
        values = incarnation(new, now_ms)
        with self._write() as connection:
            parent = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == parent_key,
                    jobs.c.nonce == parent_nonce,
                    not_terminal(),
                    jobs.c.cancel_intent_version == 0,
                )
                .values(**touched(now_ms))
                .returning(jobs.c.job_id)
            ).first()
            if parent is None:
                raise ParentNotLiveError(
                    f"Job {parent_key} has ended, was replaced or is being cancelled: it cannot submit children"
                )
            existing = connection.execute(sa.select(jobs).where(jobs.c.job_id == new.job_id)).mappings().first()
            if existing is not None and existing["state"] not in {s.value for s in JobState if s.terminal}:
                return ChildAdmission(JobRecord.from_row(existing), created=False)
            if existing is None:
                connection.execute(insert(connection, jobs).values(job_id=new.job_id, updated_at_ms=now_ms, **values))
                kind = "admitted"
            else:
                connection.execute(
                    jobs.update()
                    .where(jobs.c.job_id == new.job_id, jobs.c.nonce == existing["nonce"])
                    .values(**values, **touched(now_ms))
                )
                supersede(connection, new.job_id, existing["nonce"], now_ms)
                kind = "resubmitted"
            event(connection, new.job_id, now_ms, kind, JobState.PENDING, None, "", f"child of {parent_key}")
            row = connection.execute(sa.select(jobs).where(jobs.c.job_id == new.job_id)).mappings().one()
        return ChildAdmission(JobRecord.from_row(row), created=True)

    def request_cancel_tree(self, key: str, now_ms: int) -> list[tuple[str, CancelOutcome]]:
        """Record the intent to cancel ``key`` and every live job below it, in one transaction (the
        root first: its write orders this cancel against a child being admitted under it)."""
        with self._write() as connection:
            outcomes = [(key, request_cancel(connection, key, now_ms))]
            below = connection.execute(
                sa.select(jobs.c.job_id).where(_below(key), not_terminal()).order_by(jobs.c.job_id)
            ).scalars()
            for child in list(below):
                event(connection, child, now_ms, "tree_cancelled", None, None, "", f"its ancestor {key} was cancelled")
                outcomes.append((child, request_cancel(connection, child, now_ms)))
        return outcomes

    def tree(self, key: str) -> list[JobRecord]:
        """Every job below ``key`` (live or not), by id: its children, theirs, and so on."""
        with self._read() as connection:
            rows = connection.execute(sa.select(jobs).where(_below(key)).order_by(jobs.c.job_id)).mappings()
            return [JobRecord.from_row(row) for row in rows]

    def live_children(self) -> list[JobRecord]:
        """Live jobs that have a parent (three or more segments after the namespace's)."""
        with self._read() as connection:
            rows = connection.execute(sa.select(jobs).where(not_terminal(), jobs.c.job_id.like("%/%/%/%"))).mappings()
            return [JobRecord.from_row(row) for row in rows]

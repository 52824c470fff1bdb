"""Job trees: admitting a child under a live parent, cancelling a whole tree, finding orphans, and
(on the parent of a handed-off root) the root's children as its peer reports them, with their output.

A child is admitted only while its parent's incarnation is live and uncancelled, and the check and
the insert are one transaction that first writes the parent's row: a cancel of the parent writes
that row too, so the two serialize. Either the child is in before the cancel, and the cancel (whose
descendant scan runs after its own write of the parent, in its transaction) finds and cancels it;
or the cancel is in first, and the child is refused. A child whose parent ended without a cancel
(succeeded or failed) is found by :meth:`Trees.live_children` and killed by the tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.job_report import ChildReport
from iris_airflow_provider.core.job_tree import parent_key
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store.common import StoreBase, event, insert, not_terminal, notice, supersede, touched
from iris_airflow_provider.store.jobs import incarnation, request_cancel
from iris_airflow_provider.store.records import CancelOutcome, JobRecord, NewIncarnation
from iris_airflow_provider.store.schema import job_logs, jobs


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

    def mirror_children(self, job_id: str, nonce: str, children: Sequence[ChildReport], now_ms: int) -> bool:
        """Take the children a peer reports for incarnation ``nonce`` of ``job_id`` (its whole tree
        there), keeping where relaying each one's output has got to; whether anything changed. Also
        once the root has ended: its children end after it."""
        with self._write() as connection:
            row = _locked_children(connection, job_id, nonce)
            if row is None:
                return False
            before = {child["job_id"]: child for child in row[0] or ()}
            after = [
                {
                    "job_id": child.job_id,
                    "state": child.state.value,
                    "exit_code": child.exit_code,
                    "error": child.error,
                    "started_at_ms": child.started_at_ms,
                    "finished_at_ms": child.finished_at_ms,
                    "log_cursor": before.get(child.job_id, {}).get("log_cursor", ""),
                }
                for child in children
            ]
            if after == list(row[0] or ()):
                return False
            connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
                .values(children=after, **touched(now_ms))
            )
            changed = [c for c in after if before.get(c["job_id"], {}).get("state") != c["state"]]
            if changed:
                detail = ", ".join(f"{c['job_id']} {c['state']}" for c in changed[:20])
                event(connection, job_id, now_ms, "children", None, None, "", detail[:2000])
            for child in changed[:100]:  # the task log shows the tree as it runs on the peer
                notice(
                    connection, job_id, nonce, child_line(child["job_id"], child["state"], child["exit_code"]), now_ms
                )
        return True

    def note_child(self, child_key: str, state: JobState, exit_code: int | None, now_ms: int) -> bool:
        """Say in the parent's output (its task log) how its child ``child_key`` stands now."""
        parent = parent_key(child_key)
        with self._write() as connection:
            row = connection.execute(
                sa.select(jobs.c.nonce, jobs.c.spec).where(jobs.c.job_id == (parent or ""))
            ).first()
            child = connection.execute(sa.select(jobs.c.spec).where(jobs.c.job_id == child_key)).first()
            if row is None or child is None:
                return False
            notice(connection, parent or "", row[0], child_line(child[0]["job_id"], state.value, exit_code), now_ms)
        return True

    def append_child_logs(
        self, job_id: str, nonce: str, child_id: str, lines: Sequence[str], cursor: str, now_ms: int
    ) -> bool:
        """Keep new output lines of a mirrored child in its root's output (each line names the
        child), and where reading the child's output got to, together."""
        with self._write() as connection:
            row = _locked_children(connection, job_id, nonce)
            if row is None:
                return False
            children = [dict(child) for child in row[0] or ()]
            for child in children:
                if child["job_id"] == child_id:
                    child["log_cursor"] = cursor
            values: dict[str, Any] = {"children": children}
            if lines:
                seqs = connection.execute(
                    job_logs.insert().returning(job_logs.c.seq),
                    [
                        {"job_id": job_id, "nonce": nonce, "at_ms": now_ms, "line": f"[{child_id}] {line}"}
                        for line in lines
                    ],
                ).scalars()
                values.update(last_log_seq=max(seqs), **touched(now_ms))
            connection.execute(jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce).values(**values))
        return True


def child_line(job_id: str, state: str, exit_code: int | None) -> str:
    """How a child stands, as its parent's task log says it."""
    return f"child {job_id}: {state}" + (f" (exit code {exit_code})" if exit_code is not None else "")


def _locked_children(connection: sa.Connection, job_id: str, nonce: str) -> sa.Row[Any] | None:
    """The incarnation's mirrored children, locked: they are read, merged and written back, with no
    other writer in between (None when the incarnation is gone)."""
    return connection.execute(
        sa.select(jobs.c.children).where(jobs.c.job_id == job_id, jobs.c.nonce == nonce).with_for_update()
    ).first()

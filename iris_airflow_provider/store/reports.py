"""What a job's runner (a peer, or a local backend) reports: mirrored onto the job by compare-and-set
on its incarnation (another incarnation's news is ignored), and "gone" when it no longer has it.

A tick mirrors many reports at once (:meth:`Reports.mirror_many`): one transaction, and one
conditional update per batch of reports that write the same columns (a live state without a result
or an error of its own); each row keeps its own condition. A report that holds capacity where it
runs lets the next heartbeat release its reservation.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.cancel_settlement import killed_error
from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.start_timeout import withdrawal_records
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import (
    StoreBase,
    chunked,
    event_row,
    events,
    not_terminal,
    set_terminal,
    touched,
)
from iris_airflow_provider.store.records import replica_values
from iris_airflow_provider.store.results import record_result
from iris_airflow_provider.store.schema import jobs

# Reported states in which a job holds capacity where it runs (admitted there, or running).
HOLDING_STATES = frozenset({JobState.ACCEPTED, JobState.RUNNING})


class Reports(StoreBase):
    def mirror(self, report: JobReport, now_ms: int) -> bool:
        """Take what the job's runner (a peer, or a local backend) reports for incarnation ``report.nonce``.

        A report for a pending handoff also means the peer has it (handed off). Terminal jobs and
        other incarnations are left alone. Returns whether anything changed.
        """
        return report.job_id in self.mirror_many([report], now_ms)

    def mirror_many(self, reports: Sequence[JobReport], now_ms: int) -> set[str]:
        """:meth:`mirror` for each report (of distinct jobs), in one transaction; the ids of the jobs
        that changed. Live reports that write the same columns share one update per batch."""
        if len({report.job_id for report in reports}) != len(reports):
            raise ValueError("mirror_many: reports must be for distinct jobs (mirror them in turn)")
        changed: set[str] = set()
        shared: dict[Hashable, list[JobReport]] = defaultdict(list)
        with self._write() as connection:
            for report in reports:
                if report.state.terminal or report.serving_urls:  # its own error, result or URLs: on its own
                    changed.update(_mirror(connection, [report], now_ms))
                else:
                    shared[_shape(report)].append(report)
            for group in shared.values():
                for batch in chunked(group):
                    changed.update(_mirror(connection, batch, now_ms))
        return changed

    def mark_gone(self, job_id: str, nonce: str, now_ms: int) -> bool:
        """The runner no longer has this incarnation: cancelled if we asked for it, else failed."""
        with self._write() as connection:
            row = connection.execute(
                sa.select(jobs.c.peer_id, jobs.c.cancel_intent_version, jobs.c.handoff_state, jobs.c.direction).where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    not_terminal(),
                    jobs.c.withdraw_reason == "",  # gone from a peer withdrawing it: the withdrawal goes on
                )
            ).first()
            if row is None:
                return False
            peer_id, intent, handoff, direction = row
            if intent:
                sent = direction == Direction.SENT.value
                state, error = JobState.KILLED, reasons.CANCELLED_PEER_GONE if sent else reasons.CANCELLED
            elif direction == Direction.SENT.value:
                state, error = JobState.FAILED, f"Peer {peer_id} no longer has the job"
            else:
                state, error = JobState.FAILED, "The local backend no longer has the job"
            return set_terminal(connection, job_id, now_ms, state, error, handoff, peer_id)


def _shape(report: JobReport) -> Hashable:
    """What decides the columns a live report writes; reports of one shape share an update (the
    backend and the start time differ per job: looked up by job id in the statement)."""
    replicas = json.dumps(replica_values(report.replicas), sort_keys=True) if report.replicas else ""
    return report.state, report.error, replicas, bool(report.backend_id), report.started_at_ms is not None


def _per_job(batch: Sequence[JobReport], value: Any, type_: sa.types.TypeEngine[Any]) -> Any:
    """``value(report)`` for the row's job: the value itself for one report, else a lookup by job id."""
    if len(batch) == 1:
        return value(batch[0])
    return sa.case({r.job_id: sa.literal(value(r), type_) for r in batch}, value=jobs.c.job_id)


def _mirror(connection: sa.Connection, batch: Sequence[JobReport], now_ms: int) -> list[str]:
    """Mirror ``batch`` (reports of one shape, or one report) by one conditional update and one insert
    of their events; the ids of the jobs that changed."""
    report = batch[0]  # the shape's representative: what every report of the batch has in common
    changed = sa.or_(
        jobs.c.state != report.state.value,
        jobs.c.reported_at_ms.is_(None),
        jobs.c.handoff_state == HandoffState.PENDING.value,
    )
    arriving = jobs.c.handoff_state == HandoffState.PENDING.value
    values: dict[str, Any] = {
        "state": report.state.value,
        "reported_at_ms": sa.func.coalesce(jobs.c.reported_at_ms, now_ms),
        "handoff_state": sa.case((arriving, HandoffState.HANDED_OFF.value), else_=jobs.c.handoff_state),
        # The peer has it: its "not found" is news again, and its start timeout runs from now.
        "delivery_claimed_at_ms": sa.case((arriving, None), else_=jobs.c.delivery_claimed_at_ms),
        "handed_off_at_ms": sa.case((arriving, now_ms), else_=jobs.c.handed_off_at_ms),
        **touched(now_ms),
    }
    if report.backend_id:
        values["backend_id"] = _per_job(batch, lambda r: r.backend_id, sa.Text())
    if report.replicas:  # a report without replicas (a peer that sends none) keeps what we had
        replicas = replica_values(report.replicas)
        values["replicas"] = replicas
        changed = sa.or_(changed, jobs.c.replicas != sa.literal(replicas, jobs.c.replicas.type))
    if report.state in HOLDING_STATES:  # it holds capacity there now: the next heartbeat shows it
        values["holding_since_ms"] = sa.func.coalesce(jobs.c.holding_since_ms, now_ms)
    if report.state.terminal:
        values.update(error=report.error, exit_code=report.exit_code, finished_at_ms=report.finished_at_ms or now_ms)
        values["serving_urls"] = sa.null()  # a finished incarnation serves nothing
    elif report.serving_urls:
        # The first URLs the peer reports for this incarnation are kept (they open its ports until
        # they expire there); the condition on the nonce keeps another incarnation's away.
        values["serving_urls"] = sa.func.coalesce(
            jobs.c.serving_urls, sa.literal(dict(report.serving_urls), jobs.c.serving_urls.type)
        )
        changed = sa.or_(changed, jobs.c.serving_urls.is_(None))
    if report.state is JobState.KILLED:
        values["error"] = _killed_error(connection, report)
    if report.started_at_ms is not None:
        started = _per_job(batch, lambda r: r.started_at_ms, sa.BigInteger())
        values["started_at_ms"] = sa.func.coalesce(jobs.c.started_at_ms, started)
    withdrawal = sa.or_(jobs.c.withdraw_reason == "", sa.literal(not withdrawal_records(report.state)))
    this = sa.tuple_(jobs.c.job_id, jobs.c.nonce).in_([(r.job_id, r.nonce) for r in batch])
    rows = connection.execute(
        jobs.update()
        .where(this, not_terminal(), changed, withdrawal)
        .values(**values)
        .returning(jobs.c.job_id, jobs.c.handoff_state, jobs.c.peer_id)
    )
    after = {job_id: (handoff, peer_id) for job_id, handoff, peer_id in rows}
    mirrored = [r for r in batch if r.job_id in after]
    if report.state.terminal:
        for r in mirrored:
            record_result(connection, r.job_id, r.nonce, r.result if r.state is JobState.SUCCEEDED else None, now_ms)
    events(
        connection,
        [event_row(r.job_id, now_ms, "reported", r.state, *after[r.job_id], r.error) for r in mirrored],
    )
    return [r.job_id for r in mirrored]


def _killed_error(connection: sa.Connection, report: JobReport) -> str:
    """The error of a job its runner reports killed (see ``killed_error``)."""
    row = connection.execute(
        sa.select(jobs.c.direction, jobs.c.cancel_intent_version, jobs.c.peer_id).where(jobs.c.job_id == report.job_id)
    ).first()
    if row is None:
        return report.error
    sent = row.direction == Direction.SENT.value
    return killed_error(
        sent=sent, cancel_requested=row.cancel_intent_version > 0, peer_id=row.peer_id, reported_error=report.error
    )

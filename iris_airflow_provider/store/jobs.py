"""Jobs: admission and reincarnation, reads, state transitions and cancels (expiry: :mod:`.expiries`).

Every state change is a conditional write on the expected state (and the cancel intent), in the
transaction of its history event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.cancel_settlement import ends_at_once
from iris_airflow_provider.core.placement_projection import projection
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.common import (
    TERMINAL_VALUES,
    StoreBase,
    event,
    insert,
    not_terminal,
    placeable,
    reported_by_runner,
    set_terminal,
    supersede,
    touched,
)
from iris_airflow_provider.store.records import CancelOutcome, JobRecord, NewIncarnation, QueuedJob
from iris_airflow_provider.store.schema import jobs


@dataclass(frozen=True, slots=True)
class Admission:
    job: JobRecord
    created: bool  # False: a job with this id already existed and is returned as it is


class Jobs(StoreBase):
    def admit(self, new: NewIncarnation, now_ms: int) -> Admission:
        """Insert a new job (``queued`` when sent); an existing job with the same id is returned untouched."""
        values = incarnation(new, now_ms)
        with self._write() as connection:
            # RETURNING, not rowcount: drivers disagree on rowcount for INSERT ... ON CONFLICT.
            inserted = connection.execute(
                insert(connection, jobs)
                .values(job_id=new.job_id, updated_at_ms=now_ms, **values)
                .on_conflict_do_nothing(index_elements=["job_id"])
                .returning(jobs.c.job_id)
            ).first()
            if inserted:
                handoff = values["handoff_state"]
                event(
                    connection,
                    new.job_id,
                    now_ms,
                    "admitted",
                    JobState.PENDING,
                    handoff,
                    new.peer_id,
                    new.direction,
                )
            row = connection.execute(sa.select(jobs).where(jobs.c.job_id == new.job_id)).mappings().one()
        return Admission(JobRecord.from_row(row), created=inserted is not None)

    def reincarnate(self, new: NewIncarnation, now_ms: int) -> JobRecord | None:
        """Run a finished job again under its id, as a new incarnation (a fresh nonce, or the one given).

        Only a terminal job can be reincarnated, and only by its owner (a received job: by the peer
        that handed it over); returns None when the job is missing, still live or someone else's.
        """
        values = incarnation(new, now_ms)
        with self._write() as connection:
            replaced = connection.execute(
                sa.select(jobs.c.nonce)
                .where(jobs.c.job_id == new.job_id, jobs.c.state.in_(TERMINAL_VALUES), owned_by(new))
                .with_for_update()
            ).scalar()
            if replaced is None:
                return None
            row = (
                connection.execute(
                    jobs.update()
                    .where(jobs.c.job_id == new.job_id, jobs.c.nonce == replaced, jobs.c.state.in_(TERMINAL_VALUES))
                    .values(**values, **touched(now_ms))
                    .returning(*jobs.c)
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            supersede(connection, new.job_id, replaced, now_ms)
            handoff = values["handoff_state"]
            event(
                connection,
                new.job_id,
                now_ms,
                "resubmitted",
                JobState.PENDING,
                handoff,
                new.peer_id,
                new.direction,
            )
        return JobRecord.from_row(row)

    # Reads -------------------------------------------------------------------------------------

    def _job_records(self, query: sa.Select[Any]) -> list[JobRecord]:
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def get_job(self, job_id: str) -> JobRecord | None:
        found = self._job_records(sa.select(jobs).where(jobs.c.job_id == job_id))
        return found[0] if found else None

    def get_jobs(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        ids = list(set(job_ids))
        if not ids:
            return {}
        return {job.job_id: job for job in self._job_records(sa.select(jobs).where(jobs.c.job_id.in_(ids)))}

    def list_jobs(
        self,
        *,
        direction: Direction | None = None,
        states: Sequence[JobState] = (),
        peer_id: str | None = None,
        submitting_user: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[JobRecord]:
        query = sa.select(jobs).order_by(jobs.c.submitted_at_ms.desc(), jobs.c.job_id).limit(limit).offset(offset)
        if direction is not None:
            query = query.where(jobs.c.direction == direction.value)
        if states:
            query = query.where(jobs.c.state.in_([s.value for s in states]))
        if peer_id is not None:
            query = query.where(jobs.c.peer_id == peer_id)
        if submitting_user is not None:
            query = query.where(jobs.c.submitting_user == submitting_user)
        return self._job_records(query)

    def queued_jobs(self) -> list[JobRecord]:
        """Sent jobs still waiting for placement: queued, uncancelled, not terminal."""
        return self._job_records(sa.select(jobs).where(placeable()))

    def queued_for_placement(self) -> list[QueuedJob]:
        """The same jobs as :meth:`queued_jobs`, with only the columns placement reads: no spec
        (unless the row predates its ``placement`` projection)."""
        spec_if_unprojected = sa.case((jobs.c.placement.is_(None), jobs.c.spec), else_=sa.null())
        query = sa.select(
            jobs.c.job_id,
            jobs.c.priority_band,
            jobs.c.submitted_at_ms,
            jobs.c.scheduling_deadline_ms,
            jobs.c.placement,
            # Only a requeue sets avoided peers (and counts itself): NULL instead of an empty
            # document for the driver to decode, for the many jobs never requeued.
            sa.case((jobs.c.requeue_count > 0, jobs.c.avoided_peers), else_=sa.null()),
            sa.type_coerce(spec_if_unprojected, jobs.c.spec.type),
        ).where(placeable())
        with self._read() as connection:
            # fetchall, not row-by-row iteration: SQLAlchemy's per-row fetch was most of this read at 100k rows.
            return [QueuedJob._make(row) for row in connection.execute(query).all()]

    def live_jobs_with_origin(self) -> list[JobRecord]:
        """Jobs still live that an Airflow task submitted (for the tick's orphan check)."""
        return self._job_records(sa.select(jobs).where(not_terminal(), jobs.c.origin_dag_id.is_not(None)))

    def in_flight(self) -> list[JobRecord]:
        """Non-terminal jobs someone else runs for us: handed-off (and pending) handoffs, and local jobs."""
        return self._job_records(sa.select(jobs).where(not_terminal(), reported_by_runner()))

    # Transitions -------------------------------------------------------------------------------

    def transition(
        self,
        job_id: str,
        *,
        to_state: JobState,
        now_ms: int,
        from_states: Sequence[JobState] | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        backend_id: str | None = None,
        reported: bool = False,
    ) -> bool:
        """Move a job to ``to_state`` if it is in one of ``from_states`` (default: any non-terminal state)."""
        values: dict[str, Any] = {"state": to_state.value, **touched(now_ms)}
        if error is not None:
            values["error"] = error
        if exit_code is not None:
            values["exit_code"] = exit_code
        if backend_id is not None:
            values["backend_id"] = backend_id
        if to_state is JobState.RUNNING:
            values["started_at_ms"] = sa.func.coalesce(jobs.c.started_at_ms, now_ms)
        if to_state.terminal:
            values.update(finished_at_ms=now_ms, serving_urls=sa.null())
        if reported:
            values["reported_at_ms"] = sa.func.coalesce(jobs.c.reported_at_ms, now_ms)
        allowed = jobs.c.state.in_([s.value for s in from_states]) if from_states is not None else not_terminal()
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, allowed)
                .values(**values)
                .returning(jobs.c.handoff_state, jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            event(connection, job_id, now_ms, "state", to_state, row[0], row[1], error or "")
        return True

    def fail_start(self, job_id: str, nonce: str, error: str, now_ms: int) -> bool:
        """The local backend refused to start incarnation ``nonce``: fail it, unless it already ended
        or was replaced by a newer incarnation (a re-run must never inherit its predecessor's failure)."""
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce, not_terminal())
                .values(
                    state=JobState.FAILED.value,
                    error=error,
                    finished_at_ms=now_ms,
                    serving_urls=sa.null(),
                    **touched(now_ms),
                )
                .returning(jobs.c.handoff_state, jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            event(connection, job_id, now_ms, "state", JobState.FAILED, row[0], row[1], error)
        return True

    # Cancels -----------------------------------------------------------------------------------

    def request_cancel(self, job_id: str, now_ms: int) -> CancelOutcome:
        """Record the intent to cancel. A queued or pending handoff ends now as ``Cancelled before handoff``.

        The intent bump and the kill are one transaction, so a promotion can never slip between them;
        once the intent is set, the promotion compare-and-set can no longer match.
        """
        with self._write() as connection:
            return request_cancel(connection, job_id, now_ms)

    def pending_cancels(self) -> list[JobRecord]:
        """Cancels not yet confirmed by whoever runs the job (a peer, or a local backend)."""
        query = sa.select(jobs).where(
            jobs.c.cancel_intent_version > jobs.c.cancel_delivered_version, reported_by_runner()
        )
        return self._job_records(query)

    def confirm_cancel(self, job_id: str, nonce: str, version: int, now_ms: int) -> None:
        with self._write() as connection:
            connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce, jobs.c.cancel_delivered_version < version)
                .values(cancel_delivered_version=version, **touched(now_ms))
            )


def request_cancel(connection: sa.Connection, job_id: str, now_ms: int) -> CancelOutcome:
    """``FederationStore.request_cancel`` on an open write transaction (also run from async code)."""
    bumped = connection.execute(
        jobs.update()
        .where(jobs.c.job_id == job_id, not_terminal())
        # A cancel supersedes a withdrawal in progress: the job ends where it is, it is not requeued.
        .values(cancel_intent_version=jobs.c.cancel_intent_version + 1, withdraw_reason="", **touched(now_ms))
        .returning(
            jobs.c.direction,
            jobs.c.handoff_state,
            jobs.c.peer_id,
            jobs.c.cancel_intent_version,
            jobs.c.delivery_claimed_at_ms,
            jobs.c.delivery_attempts,
        )
    ).first()
    if bumped is None:
        exists = connection.execute(sa.select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first()
        return CancelOutcome(found=exists is not None, was_terminal=exists is not None)
    direction, peer_id = Direction(bumped.direction), bumped.peer_id
    handoff = HandoffState(bumped.handoff_state) if bumped.handoff_state else None
    event(connection, job_id, now_ms, "cancel_requested", None, handoff, peer_id)
    if direction is Direction.SENT and ends_at_once(
        handoff, claimed_at_ms=bumped.delivery_claimed_at_ms, delivery_attempts=bumped.delivery_attempts
    ):
        # Nothing ever left for a peer: ended here, with nothing to tell anyone.
        connection.execute(
            jobs.update().where(jobs.c.job_id == job_id).values(cancel_delivered_version=bumped.cancel_intent_version)
        )
        killed = set_terminal(
            connection, job_id, now_ms, JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF, handoff, peer_id
        )
        return CancelOutcome(found=True, killed=killed, direction=direction)
    # A delivery was started: the peer may have the job, or get it yet. It ends when the peer says
    # it killed it, or that it never had it once no delivery can still bring it there.
    notify = peer_id if direction is Direction.SENT else ""
    return CancelOutcome(found=True, killed=False, direction=direction, notify_peer=notify)


def owned_by(new: NewIncarnation) -> sa.ColumnElement[bool]:
    """The job's stored owner is the new incarnation's: for a received job its peer, else its DAG,
    task and accountable user."""
    if new.direction is Direction.RECEIVED:
        return sa.and_(jobs.c.direction == Direction.RECEIVED.value, jobs.c.peer_id == new.peer_id)
    owner = new.owner
    return sa.and_(
        jobs.c.direction != Direction.RECEIVED.value,
        sa.func.coalesce(jobs.c.origin_dag_id, "") == owner.dag_id,
        sa.func.coalesce(jobs.c.origin_task_id, "") == owner.task_id,
        jobs.c.submitting_user == owner.user,
    )


def incarnation(new: NewIncarnation, now_ms: int) -> dict[str, Any]:
    """Every column a new incarnation of a job starts from (a first admission, or a rerun)."""
    return {
        "direction": new.direction.value,
        "handoff_state": HandoffState.QUEUED.value if new.direction is Direction.SENT else None,
        "state": JobState.PENDING.value,
        "peer_id": new.peer_id,
        "backend_id": new.backend_id,
        "owner_principal": new.owner_principal,
        "submitting_user": new.submitting_user,
        "nonce": new.nonce or uuid.uuid4().hex,
        "cancel_intent_version": 0,
        "cancel_delivered_version": 0,
        "priority_band": new.spec.priority_band.wire_name,
        "submitted_at_ms": now_ms,
        "scheduling_deadline_ms": new.spec.scheduling_deadline_ms,
        "spec": new.spec.model_dump(mode="json"),
        "placement": projection(new.spec),
        "error": "",
        "exit_code": None,
        "started_at_ms": None,
        "finished_at_ms": None,
        "reported_at_ms": None,
        "delivery_attempts": 0,
        "next_delivery_at_ms": None,
        "last_delivery_error": "",
        "handoff_since_ms": None,
        "requeue_count": 0,
        "avoided_peers": {},
        "holding_since_ms": None,
        "serving_urls": sa.null(),
        "log_cursor": "",
        "last_log_seq": 0,
        "origin_dag_id": new.origin.dag_id if new.origin else None,
        "origin_run_id": new.origin.run_id if new.origin else None,
        "origin_task_id": new.origin.task_id if new.origin else None,
        "origin_map_index": new.origin.map_index if new.origin else None,
    }

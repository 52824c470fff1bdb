"""The federation store: the single source of truth for jobs, peers, the ledger and leases.

Every state change is a conditional write (compare-and-set on the expected state and the cancel
intent), in the same transaction as its history event, so concurrent ticks, cancels, retries and
workers can race freely without corrupting anything: a promotion only happens to a job that is
still queued, uncancelled and not terminal, and a cancel racing it always wins.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from iris_airflow_provider.federation import reasons
from iris_airflow_provider.federation.availability import Availability, PeerBackend, PeerState
from iris_airflow_provider.federation.bands import parse_band
from iris_airflow_provider.federation.constraints import normalize_advertised
from iris_airflow_provider.federation.ledger import LedgerEntry
from iris_airflow_provider.federation.model import JobSpec
from iris_airflow_provider.federation.placement import Promotion
from iris_airflow_provider.federation.states import TERMINAL, Direction, HandoffState, JobState
from iris_airflow_provider.store.engine import WRITE, create_store_engine
from iris_airflow_provider.store.records import (
    BackendRecord,
    CancelOutcome,
    JobEvent,
    JobRecord,
    Origin,
    PeerRecord,
)
from iris_airflow_provider.store.schema import (
    VERSION_TABLE,
    abandoned_handoffs,
    job_events,
    job_logs,
    jobs,
    leases,
    ledger,
    peer_backends,
    peer_sync,
    peers,
)

_TERMINAL = tuple(s.value for s in TERMINAL)
_RUN_HERE = (Direction.LOCAL.value, Direction.RECEIVED.value)  # jobs one of this cluster's backends runs
_MIGRATION_LOCK = 0x1815_FED  # PostgreSQL advisory lock id held while migrating


@dataclass(frozen=True, slots=True)
class Admission:
    job: JobRecord
    created: bool  # False: a job with this id already existed and is returned as it is


class RequeueOutcome(StrEnum):
    REQUEUED = "requeued"  # back in the queue, avoiding the peer for a while
    EXHAUSTED = "exhausted"  # its requeue budget was spent: the job failed
    STALE = "stale"  # the handoff had already moved on (delivered, cancelled, ended): nothing done


@dataclass(frozen=True, slots=True)
class AbandonedHandoff:
    peer_id: str
    job_id: str
    nonce: str
    abandoned_at_ms: int
    reason: str


class FederationStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(cls, url: str) -> FederationStore:
        return cls(create_store_engine(url))

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    def dispose(self) -> None:
        self.engine.dispose()

    # Transactions ------------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        with self.engine.connect().execution_options(**{WRITE: True}) as connection, connection.begin():
            yield connection

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as connection, connection.begin():
            yield connection

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to the newest revision (or to ``revision``); safe to call from several
        processes at once."""
        config = Config()
        config.set_main_option("script_location", str(files("iris_airflow_provider.store") / "migrations"))
        target = ScriptDirectory.from_config(config).get_current_head() if revision == "head" else revision
        if self.revision() == target:
            return  # the common case, on every process start: no write lock taken
        alembic_log = logging.getLogger("alembic")
        level = alembic_log.level
        alembic_log.setLevel(logging.WARNING)  # keep "Running upgrade ..." out of task logs
        try:
            with self._write() as connection:
                if connection.dialect.name == "postgresql":
                    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK})
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
        finally:
            alembic_log.setLevel(level)

    def revision(self) -> str | None:
        """The schema revision this database is at (None: not created yet)."""
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()

    # Jobs --------------------------------------------------------------------------------------

    def admit(
        self,
        spec: JobSpec,
        *,
        direction: Direction,
        now_ms: int,
        submitting_user: str,
        owner_principal: str = "",
        peer_id: str = "",
        backend_id: str = "",
        nonce: str | None = None,
        origin: Origin | None = None,
    ) -> Admission:
        """Insert a new job (``queued`` when sent); an existing job with the same id is returned untouched."""
        values = _incarnation(
            spec,
            direction=direction,
            now_ms=now_ms,
            submitting_user=submitting_user,
            owner_principal=owner_principal,
            peer_id=peer_id,
            backend_id=backend_id,
            nonce=nonce,
            origin=origin,
        )
        handoff = values["handoff_state"]
        with self._write() as connection:
            # RETURNING, not rowcount: drivers disagree on rowcount for INSERT ... ON CONFLICT.
            inserted = connection.execute(
                _insert(connection, jobs)
                .values(job_id=spec.job_id, updated_at_ms=now_ms, **values)
                .on_conflict_do_nothing(index_elements=["job_id"])
                .returning(jobs.c.job_id)
            ).first()
            if inserted:
                _event(connection, spec.job_id, now_ms, "admitted", JobState.PENDING, handoff, peer_id, direction)
            row = connection.execute(sa.select(jobs).where(jobs.c.job_id == spec.job_id)).mappings().one()
        return Admission(JobRecord.from_row(row), created=inserted is not None)

    def reincarnate(
        self,
        spec: JobSpec,
        *,
        direction: Direction,
        now_ms: int,
        submitting_user: str,
        owner_principal: str = "",
        peer_id: str = "",
        backend_id: str = "",
        origin: Origin | None = None,
        nonce: str | None = None,
    ) -> JobRecord | None:
        """Run a finished job again under its id, as a new incarnation (a fresh nonce, or the one given).

        Only a terminal job can be reincarnated; returns None when the job is missing or still live.
        """
        values = _incarnation(
            spec,
            direction=direction,
            now_ms=now_ms,
            submitting_user=submitting_user,
            owner_principal=owner_principal,
            peer_id=peer_id,
            backend_id=backend_id,
            nonce=nonce,
            origin=origin,
        )
        handoff = values["handoff_state"]
        with self._write() as connection:
            row = (
                connection.execute(
                    jobs.update()
                    .where(jobs.c.job_id == spec.job_id, jobs.c.state.in_(_TERMINAL))
                    .values(**values, **_touched(now_ms))
                    .returning(*jobs.c)
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            _event(connection, spec.job_id, now_ms, "resubmitted", JobState.PENDING, handoff, peer_id, direction)
        return JobRecord.from_row(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._read() as connection:
            row = connection.execute(sa.select(jobs).where(jobs.c.job_id == job_id)).mappings().first()
        return JobRecord.from_row(row) if row else None

    def get_jobs(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        ids = list(set(job_ids))
        if not ids:
            return {}
        with self._read() as connection:
            rows = connection.execute(sa.select(jobs).where(jobs.c.job_id.in_(ids))).mappings().all()
        return {row["job_id"]: JobRecord.from_row(row) for row in rows}

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
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def queued_jobs(self) -> list[JobRecord]:
        """Sent jobs still waiting for placement: queued, uncancelled, not terminal."""
        query = sa.select(jobs).where(
            jobs.c.direction == Direction.SENT.value,
            jobs.c.handoff_state == HandoffState.QUEUED.value,
            jobs.c.cancel_intent_version == 0,
            jobs.c.state.not_in(_TERMINAL),
        )
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def live_jobs_with_origin(self) -> list[JobRecord]:
        """Jobs still live that an Airflow task submitted (for the tick's orphan check)."""
        query = sa.select(jobs).where(jobs.c.state.not_in(_TERMINAL), jobs.c.origin_dag_id.is_not(None))
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def events(self, job_id: str) -> list[JobEvent]:
        query = sa.select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.seq)
        with self._read() as connection:
            return [JobEvent(**row) for row in connection.execute(query).mappings()]

    # Placement ---------------------------------------------------------------------------------

    def expire_queued(self, now_ms: int) -> list[str]:
        """Queued jobs past their deadline become unschedulable; they can never be promoted after."""
        with self._write() as connection:
            expired = connection.execute(
                jobs.update()
                .where(
                    jobs.c.direction == Direction.SENT.value,
                    jobs.c.handoff_state == HandoffState.QUEUED.value,
                    jobs.c.state.not_in(_TERMINAL),
                    jobs.c.scheduling_deadline_ms.is_not(None),
                    jobs.c.scheduling_deadline_ms < now_ms,
                )
                .values(
                    state=JobState.UNSCHEDULABLE.value,
                    error=reasons.SCHEDULING_TIMEOUT,
                    finished_at_ms=now_ms,
                    **_touched(now_ms),
                )
                .returning(jobs.c.job_id, jobs.c.peer_id)
            ).all()
            for job_id, peer_id in expired:
                _event(connection, job_id, now_ms, "expired", JobState.UNSCHEDULABLE, HandoffState.QUEUED, peer_id)
        return sorted(job_id for job_id, _ in expired)

    def apply_promotions(self, promotions: Iterable[Promotion], now_ms: int) -> list[Promotion]:
        """Apply each promotion by compare-and-set; charge the ledger for the confirmed ones only."""
        confirmed = []
        with self._write() as connection:
            for promotion in promotions:
                if _promote(connection, promotion, now_ms):
                    confirmed.append(promotion)
                    _charge_ledger(connection, promotion)
        return confirmed

    def promote(self, promotion: Promotion, now_ms: int) -> bool:
        return bool(self.apply_promotions([promotion], now_ms))

    def request_cancel(self, job_id: str, now_ms: int) -> CancelOutcome:
        """Record the intent to cancel. A queued or pending handoff ends now as ``Cancelled before handoff``.

        The intent bump and the kill are one transaction, so a promotion can never slip between them;
        once the intent is set, the promotion compare-and-set can no longer match.
        """
        with self._write() as connection:
            return request_cancel(connection, job_id, now_ms)

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
        allowed = [s.value for s in from_states] if from_states is not None else None
        values: dict[str, Any] = {"state": to_state.value, **_touched(now_ms)}
        if error is not None:
            values["error"] = error
        if exit_code is not None:
            values["exit_code"] = exit_code
        if backend_id is not None:
            values["backend_id"] = backend_id
        if to_state is JobState.RUNNING:
            values["started_at_ms"] = sa.func.coalesce(jobs.c.started_at_ms, now_ms)
        if to_state.terminal:
            values["finished_at_ms"] = now_ms
        if reported:
            values["reported_at_ms"] = sa.func.coalesce(jobs.c.reported_at_ms, now_ms)
        condition = jobs.c.state.in_(allowed) if allowed is not None else jobs.c.state.not_in(_TERMINAL)
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, condition)
                .values(**values)
                .returning(jobs.c.handoff_state, jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            _event(connection, job_id, now_ms, "state", to_state, row[0], row[1], error or "")
        return True

    # Delivery, sync and cancel re-drive ------------------------------------------------------

    def pending_handoffs(self, now_ms: int) -> list[JobRecord]:
        """Promoted jobs to deliver now: pending, uncancelled, not terminal, not backing off."""
        query = sa.select(jobs).where(
            jobs.c.direction == Direction.SENT.value,
            jobs.c.handoff_state == HandoffState.PENDING.value,
            jobs.c.cancel_intent_version == 0,
            jobs.c.state.not_in(_TERMINAL),
            sa.or_(jobs.c.next_delivery_at_ms.is_(None), jobs.c.next_delivery_at_ms <= now_ms),
        )
        with self._read() as connection:
            return [
                JobRecord.from_row(row) for row in connection.execute(query.order_by(jobs.c.submitted_at_ms)).mappings()
            ]

    def mark_handed_off(self, job_id: str, nonce: str, now_ms: int) -> bool:
        """The peer admitted this incarnation. Applies even if a cancel raced the delivery: the
        re-drive then routes that cancel to the peer, which now has the job."""
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    jobs.c.handoff_state == HandoffState.PENDING.value,
                )
                .values(handoff_state=HandoffState.HANDED_OFF.value, last_delivery_error="", **_touched(now_ms))
                .returning(jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            _event(connection, job_id, now_ms, "handed_off", None, HandoffState.HANDED_OFF, row[0])
        return True

    def reject_handoff(self, job_id: str, nonce: str, message: str, now_ms: int) -> bool:
        """The peer refused this incarnation for good: the job ends with the peer's message."""
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    jobs.c.handoff_state == HandoffState.PENDING.value,
                )
                .values(handoff_state=HandoffState.REJECTED.value, last_delivery_error=message, **_touched(now_ms))
                .returning(jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            peer_id = row[0]
            _event(connection, job_id, now_ms, "rejected", None, HandoffState.REJECTED, peer_id, message)
            _set_terminal(
                connection,
                job_id,
                now_ms,
                JobState.KILLED,
                reasons.peer_rejected(peer_id, message),
                HandoffState.REJECTED,
                peer_id,
            )
        return True

    def defer_delivery(self, job_id: str, nonce: str, error: str, retry_at_ms: int, now_ms: int) -> bool:
        """A delivery failed in a way a retry may fix: count it and wait until ``retry_at_ms``."""
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(
                    jobs.c.job_id == job_id,
                    jobs.c.nonce == nonce,
                    jobs.c.handoff_state == HandoffState.PENDING.value,
                )
                .values(
                    delivery_attempts=jobs.c.delivery_attempts + 1,
                    next_delivery_at_ms=retry_at_ms,
                    last_delivery_error=error,
                    **_touched(now_ms),
                )
                .returning(jobs.c.peer_id, jobs.c.delivery_attempts)
            ).first()
            if row is None:
                return False
            detail = f"attempt {row[1]} failed (will retry): {error}"
            _event(connection, job_id, now_ms, "delivery_failed", None, HandoffState.PENDING, row[0], detail)
        return True

    def requeue_handoff(
        self,
        job_id: str,
        nonce: str,
        *,
        peer_id: str,
        reason: str,
        avoid_until_ms: int,
        max_requeues: int,
        now_ms: int,
    ) -> RequeueOutcome:
        """Send a pending handoff that ``peer_id`` could not take back to the queue, avoiding that peer
        until ``avoid_until_ms``; once the job has been requeued ``max_requeues`` times, fail it instead.

        Either way the peer is remembered as possibly holding this incarnation (an answer may have
        been lost), so it is told to terminate it there; a requeued job goes on under a new nonce.
        Only a handoff still pending on ``peer_id``, uncancelled and not terminal, moves (whether a
        pinned job may move at all is the caller's decision).
        """
        with self._write() as connection:
            row = (
                connection.execute(
                    sa.select(jobs.c.requeue_count, jobs.c.avoided_peers)
                    .where(
                        jobs.c.job_id == job_id,
                        jobs.c.nonce == nonce,
                        jobs.c.direction == Direction.SENT.value,
                        jobs.c.handoff_state == HandoffState.PENDING.value,
                        jobs.c.peer_id == peer_id,
                        jobs.c.cancel_intent_version == 0,
                        jobs.c.state.not_in(_TERMINAL),
                    )
                    .with_for_update()
                )
                .mappings()
                .first()
            )
            if row is None:
                return RequeueOutcome.STALE
            connection.execute(
                _insert(connection, abandoned_handoffs)
                .values(peer_id=peer_id, job_id=job_id, nonce=nonce, abandoned_at_ms=now_ms, reason=reason)
                .on_conflict_do_nothing()
            )
            if row["requeue_count"] >= max_requeues:
                message = reasons.requeues_exhausted(row["requeue_count"], peer_id, reason)
                connection.execute(
                    jobs.update()
                    .where(jobs.c.job_id == job_id)  # locked by the read above
                    .values(handoff_state=HandoffState.REJECTED.value, last_delivery_error=reason, **_touched(now_ms))
                )
                _event(connection, job_id, now_ms, "rejected", None, HandoffState.REJECTED, peer_id, reason)
                _set_terminal(connection, job_id, now_ms, JobState.FAILED, message, HandoffState.REJECTED, peer_id)
                return RequeueOutcome.EXHAUSTED
            avoided = {p: until for p, until in (row["avoided_peers"] or {}).items() if until > now_ms}
            avoided[peer_id] = max(avoid_until_ms, avoided.get(peer_id, 0))
            # A new nonce: the peer it left may hold the old one (terminated there by that nonce), and
            # a later delivery must never be taken there for a replay of what was terminated.
            fresh_nonce = uuid.uuid4().hex
            connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id)  # locked by the read above
                .values(
                    nonce=fresh_nonce,
                    handoff_state=HandoffState.QUEUED.value,
                    peer_id="",
                    backend_id="",
                    handoff_since_ms=None,
                    requeue_count=jobs.c.requeue_count + 1,
                    avoided_peers=avoided,
                    delivery_attempts=0,
                    next_delivery_at_ms=None,
                    last_delivery_error=reason,
                    **_touched(now_ms),
                )
            )
            detail = f"requeue {row['requeue_count'] + 1} of {max_requeues}: {reason}"
            _event(connection, job_id, now_ms, "requeued", None, HandoffState.QUEUED, peer_id, detail)
            _notice(
                connection,
                job_id,
                fresh_nonce,
                f"Back in the queue: peer {peer_id} could not take the job ({detail}); "
                f"it avoids that peer for {max(0, avoid_until_ms - now_ms) // 1000} s",
                now_ms,
            )
        return RequeueOutcome.REQUEUED

    def abandoned_handoffs(self) -> list[AbandonedHandoff]:
        """Incarnations to terminate on the peers that may hold them, oldest first."""
        query = sa.select(abandoned_handoffs).order_by(abandoned_handoffs.c.abandoned_at_ms)
        with self._read() as connection:
            return [AbandonedHandoff(**row) for row in connection.execute(query).mappings()]

    def forget_abandoned(self, handoff: AbandonedHandoff, now_ms: int, *, terminated: bool) -> None:
        """The peer confirmed it no longer runs that incarnation (``terminated``: it just stopped it)."""
        with self._write() as connection:
            deleted = connection.execute(
                abandoned_handoffs.delete().where(
                    abandoned_handoffs.c.peer_id == handoff.peer_id,
                    abandoned_handoffs.c.job_id == handoff.job_id,
                    abandoned_handoffs.c.nonce == handoff.nonce,
                )
            ).rowcount
            if deleted and terminated:
                detail = f"terminated the incarnation left there by a requeue ({handoff.reason})"
                _event(connection, handoff.job_id, now_ms, "stray_terminated", None, None, handoff.peer_id, detail)

    def in_flight(self) -> list[JobRecord]:
        """Non-terminal jobs someone else runs for us: handed-off (and pending) handoffs, and local jobs."""
        query = sa.select(jobs).where(
            jobs.c.state.not_in(_TERMINAL),
            sa.or_(
                jobs.c.direction.in_(_RUN_HERE),
                sa.and_(
                    jobs.c.direction == Direction.SENT.value,
                    jobs.c.handoff_state.in_([HandoffState.PENDING.value, HandoffState.HANDED_OFF.value]),
                ),
            ),
        )
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def mirror(
        self,
        job_id: str,
        *,
        nonce: str,
        state: JobState,
        now_ms: int,
        backend_id: str = "",
        error: str = "",
        exit_code: int | None = None,
        started_at_ms: int | None = None,
        finished_at_ms: int | None = None,
    ) -> bool:
        """Take what the job's runner reports (a peer, or a local backend) for this incarnation.

        A report for a pending handoff also means the peer has it (handed off). Terminal jobs and
        other incarnations are left alone. Returns whether anything changed.
        """
        changed = sa.or_(
            jobs.c.state != state.value,
            jobs.c.reported_at_ms.is_(None),
            jobs.c.handoff_state == HandoffState.PENDING.value,
        )
        values: dict[str, Any] = {
            "state": state.value,
            "reported_at_ms": sa.func.coalesce(jobs.c.reported_at_ms, now_ms),
            "handoff_state": sa.case(
                (jobs.c.handoff_state == HandoffState.PENDING.value, HandoffState.HANDED_OFF.value),
                else_=jobs.c.handoff_state,
            ),
            **_touched(now_ms),
        }
        if backend_id:
            values["backend_id"] = backend_id
        if state.terminal:
            values.update(error=error, exit_code=exit_code, finished_at_ms=finished_at_ms or now_ms)
        if started_at_ms is not None:
            values["started_at_ms"] = sa.func.coalesce(jobs.c.started_at_ms, started_at_ms)
        with self._write() as connection:
            row = connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce, jobs.c.state.not_in(_TERMINAL), changed)
                .values(**values)
                .returning(jobs.c.handoff_state, jobs.c.peer_id)
            ).first()
            if row is None:
                return False
            _event(connection, job_id, now_ms, "reported", state, row[0], row[1], error)
        return True

    def mark_gone(self, job_id: str, nonce: str, now_ms: int) -> bool:
        """The runner no longer has this incarnation: cancelled if we asked for it, else failed."""
        with self._write() as connection:
            row = connection.execute(
                sa.select(jobs.c.peer_id, jobs.c.cancel_intent_version, jobs.c.handoff_state, jobs.c.direction).where(
                    jobs.c.job_id == job_id, jobs.c.nonce == nonce, jobs.c.state.not_in(_TERMINAL)
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
            return _set_terminal(connection, job_id, now_ms, state, error, handoff, peer_id)

    def pending_cancels(self) -> list[JobRecord]:
        """Cancels not yet confirmed by whoever runs the job (a peer, or a local backend)."""
        query = sa.select(jobs).where(
            jobs.c.cancel_intent_version > jobs.c.cancel_delivered_version,
            sa.or_(
                jobs.c.direction.in_(_RUN_HERE),
                sa.and_(
                    jobs.c.direction == Direction.SENT.value,
                    jobs.c.handoff_state.in_([HandoffState.PENDING.value, HandoffState.HANDED_OFF.value]),
                ),
            ),
        )
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def confirm_cancel(self, job_id: str, nonce: str, version: int, now_ms: int) -> None:
        with self._write() as connection:
            connection.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.nonce == nonce, jobs.c.cancel_delivered_version < version)
                .values(cancel_delivered_version=version, **_touched(now_ms))
            )

    def sync_cursor(self, peer_id: str) -> str:
        with self._read() as connection:
            cursor = connection.execute(sa.select(peer_sync.c.cursor).where(peer_sync.c.peer_id == peer_id)).scalar()
        return cursor or ""

    def save_sync_cursor(self, peer_id: str, cursor: str, now_ms: int) -> None:
        values = {"cursor": cursor, "synced_at_ms": now_ms}
        with self._write() as connection:
            connection.execute(
                _insert(connection, peer_sync)
                .values(peer_id=peer_id, **values)
                .on_conflict_do_update(index_elements=["peer_id"], set_=values)
            )

    # Relayed output ----------------------------------------------------------------------------

    def append_logs(self, job_id: str, nonce: str, lines: Sequence[str], cursor: str, now_ms: int) -> bool:
        """Keep new output lines of this incarnation and where reading got to, together."""
        with self._write() as connection:
            current = connection.execute(
                sa.select(jobs.c.job_id).where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
            ).first()
            if current is None:
                return False
            values: dict[str, Any] = {"log_cursor": cursor}
            if lines:
                seqs = connection.execute(
                    job_logs.insert().returning(job_logs.c.seq),
                    [{"job_id": job_id, "nonce": nonce, "at_ms": now_ms, "line": line} for line in lines],
                ).scalars()
                # A change waiting tasks notice: their poller then fetches the new lines.
                values.update(last_log_seq=max(seqs), **_touched(now_ms))
            connection.execute(jobs.update().where(jobs.c.job_id == job_id, jobs.c.nonce == nonce).values(**values))
        return True

    def flag(self, job_id: str, nonce: str, kind: str, message: str, now_ms: int, *, peer_id: str = "") -> bool:
        """Warn about this incarnation: an event in its history, and a line in the output its waiting
        task relays into the task log (prefixed, so it is not taken for the job's own output)."""
        with self._write() as connection:
            current = connection.execute(
                sa.select(jobs.c.handoff_state).where(jobs.c.job_id == job_id, jobs.c.nonce == nonce)
            ).first()
            if current is None:
                return False
            _event(connection, job_id, now_ms, kind, None, current[0], peer_id, message)
            _notice(connection, job_id, nonce, f"Warning: {message}", now_ms)
        return True

    def log_lines(self, job_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[tuple[int, str]]:
        query = (
            sa.select(job_logs.c.seq, job_logs.c.line)
            .where(job_logs.c.job_id == job_id, job_logs.c.seq > after_seq)
            .order_by(job_logs.c.seq)
            .limit(limit)
        )
        with self._read() as connection:
            return [(row[0], row[1]) for row in connection.execute(query)]

    # The peer side: what requesters may learn about the jobs they handed us ----------------

    def record_event(self, job_id: str, kind: str, now_ms: int, detail: str = "") -> None:
        """A history event without a state change (e.g. a replayed handoff), so syncs report the job again."""
        with self._write() as connection:
            row = connection.execute(
                sa.select(jobs.c.state, jobs.c.handoff_state, jobs.c.peer_id).where(jobs.c.job_id == job_id)
            ).first()
            if row is not None:
                _event(connection, job_id, now_ms, kind, JobState(row[0]), row[1], row[2], detail)

    def latest_event_seq(self) -> int:
        with self._read() as connection:
            return int(connection.execute(sa.select(sa.func.max(job_events.c.seq))).scalar() or 0)

    def received_jobs(self, requester: str) -> list[JobRecord]:
        query = sa.select(jobs).where(jobs.c.direction == Direction.RECEIVED.value, jobs.c.peer_id == requester)
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query.order_by(jobs.c.job_id)).mappings()]

    def received_changes(self, requester: str, *, after_seq: int, limit: int = 10_000) -> list[tuple[str, int]]:
        """Jobs received from ``requester`` with history events after ``after_seq``, as (job id, seq of
        its newest event), oldest change first."""
        query = (
            sa.select(job_events.c.job_id, sa.func.max(job_events.c.seq).label("last"))
            .where(job_events.c.seq > after_seq, job_events.c.peer_id == requester)
            .group_by(job_events.c.job_id)
            .order_by(sa.text("last"))
            .limit(limit)
        )
        with self._read() as connection:
            return [(row[0], row[1]) for row in connection.execute(query)]

    # Peers -------------------------------------------------------------------------------------

    def record_heartbeat(
        self, peer_id: str, now_ms: int, backends: Sequence[PeerBackend] | None, *, error: str = ""
    ) -> None:
        """Store a peer's heartbeat: its backends replace the previous ones. ``None``: the call failed,
        the peer becomes unreachable and its last known backends are kept."""
        with self._write() as connection:
            reached = backends is not None
            values: dict[str, Any] = {"reachable": reached, "last_attempt_ms": now_ms, "last_error": error}
            if reached:
                values["last_contact_ms"] = now_ms
            connection.execute(
                _insert(connection, peers)
                .values(peer_id=peer_id, **values)
                .on_conflict_do_update(index_elements=["peer_id"], set_=values)
            )
            if backends is None:
                return
            connection.execute(peer_backends.delete().where(peer_backends.c.peer_id == peer_id))
            if backends:
                connection.execute(
                    peer_backends.insert(),
                    [
                        {
                            "peer_id": peer_id,
                            "backend_id": backend.backend_id,
                            "kind": backend.kind,
                            "attributes": {k: list(v) for k, v in backend.advertised.items()},
                            "availability": backend.availability.to_wire() if backend.availability else None,
                            "observation_epoch_ms": backend.availability.observation_epoch_ms
                            if backend.tracked and backend.availability
                            else None,
                            "received_at_ms": now_ms,
                        }
                        for backend in backends
                    ],
                )

    def forget_peers(self, keep: Iterable[str]) -> None:
        """Drop peers (and their ledger rows) that are no longer configured."""
        keep = list(keep)
        with self._write() as connection:
            connection.execute(peers.delete().where(peers.c.peer_id.not_in(keep)))
            connection.execute(ledger.delete().where(ledger.c.peer_id.not_in(keep)))

    def peers(self) -> list[PeerRecord]:
        with self._read() as connection:
            peer_rows = connection.execute(sa.select(peers).order_by(peers.c.peer_id)).mappings().all()
            backend_rows = (
                connection.execute(sa.select(peer_backends).order_by(peer_backends.c.backend_id)).mappings().all()
            )
        by_peer: dict[str, list[BackendRecord]] = {}
        for row in backend_rows:
            by_peer.setdefault(row["peer_id"], []).append(
                BackendRecord(
                    row["backend_id"],
                    row["kind"],
                    row["attributes"],
                    row["availability"],
                    row["observation_epoch_ms"],
                    row["received_at_ms"],
                )
            )
        return [
            PeerRecord(
                row["peer_id"],
                row["reachable"],
                row["last_contact_ms"],
                row["last_attempt_ms"],
                row["last_error"],
                tuple(by_peer.get(row["peer_id"], ())),
            )
            for row in peer_rows
        ]

    def peer_states(self) -> list[PeerState]:
        """Peers as the core sees them: reachability, last contact, backends with availability."""
        return [
            PeerState(
                record.peer_id,
                record.reachable,
                record.last_contact_ms or 0,
                tuple(_peer_backend(backend) for backend in record.backends),
            )
            for record in self.peers()
        ]

    # Ledger ------------------------------------------------------------------------------------

    def ledger(self) -> list[LedgerEntry]:
        with self._read() as connection:
            rows = connection.execute(sa.select(ledger)).mappings().all()
        grouped: dict[tuple[str, str, int], dict[str, int]] = {}
        for row in rows:
            key = (row["peer_id"], row["backend_id"], row["observation_epoch_ms"])
            grouped.setdefault(key, {})[row["token"]] = row["amount"]
        return [LedgerEntry(p, b, epoch, amounts) for (p, b, epoch), amounts in sorted(grouped.items())]

    def prune_ledger(self) -> int:
        """Drop rows a strictly newer observation has superseded, or whose backend reports no capacity."""
        current = peer_backends.alias("current")
        still_applies = (
            sa.select(sa.literal(1))
            .where(
                current.c.peer_id == ledger.c.peer_id,
                current.c.backend_id == ledger.c.backend_id,
                current.c.observation_epoch_ms.is_not(None),
                current.c.observation_epoch_ms <= ledger.c.observation_epoch_ms,
            )
            .exists()
        )
        with self._write() as connection:
            return connection.execute(ledger.delete().where(~still_applies)).rowcount

    # Leases ------------------------------------------------------------------------------------

    def acquire_lease(self, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool:
        """Take or renew ``name`` for ``holder`` unless someone else holds it unexpired."""
        values = {"holder": holder, "expires_at_ms": now_ms + ttl_ms}
        with self._write() as connection:
            statement = (
                _insert(connection, leases)
                .values(name=name, **values)
                .on_conflict_do_update(
                    index_elements=["name"],
                    set_=values,
                    where=(leases.c.holder == holder) | (leases.c.expires_at_ms <= now_ms),
                )
            )
            return connection.execute(statement.returning(leases.c.name)).first() is not None

    def release_lease(self, name: str, holder: str) -> None:
        with self._write() as connection:
            connection.execute(leases.delete().where(leases.c.name == name, leases.c.holder == holder))


def request_cancel(connection: sa.Connection, job_id: str, now_ms: int) -> CancelOutcome:
    """``FederationStore.request_cancel`` on an open write transaction (also run from async code)."""
    bumped = connection.execute(
        jobs.update()
        .where(jobs.c.job_id == job_id, jobs.c.state.not_in(_TERMINAL))
        .values(cancel_intent_version=jobs.c.cancel_intent_version + 1, **_touched(now_ms))
        .returning(jobs.c.direction, jobs.c.handoff_state, jobs.c.peer_id)
    ).first()
    if bumped is None:
        exists = connection.execute(sa.select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first()
        return CancelOutcome(found=exists is not None, was_terminal=exists is not None)
    direction, handoff, peer_id = Direction(bumped[0]), bumped[1], bumped[2]
    _event(connection, job_id, now_ms, "cancel_requested", None, handoff, peer_id)
    killed = False
    if direction is Direction.SENT and handoff in (HandoffState.QUEUED, HandoffState.PENDING):
        killed = _set_terminal(
            connection, job_id, now_ms, JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF, handoff, peer_id
        )
    # A pending handoff may have been delivered already: tell its peer too (best effort, re-driven).
    notify = peer_id if direction is Direction.SENT and handoff != HandoffState.QUEUED else ""
    return CancelOutcome(found=True, killed=killed, direction=direction, notify_peer=notify)


# Statements shared by several operations ---------------------------------------------------------


def _insert(connection: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that supports ON CONFLICT on both PostgreSQL and SQLite."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def _incarnation(
    spec: JobSpec,
    *,
    direction: Direction,
    now_ms: int,
    submitting_user: str,
    owner_principal: str,
    peer_id: str,
    backend_id: str,
    nonce: str | None,
    origin: Origin | None,
) -> dict[str, Any]:
    """Every column a new incarnation of a job starts from (a first admission, or a rerun)."""
    return {
        "direction": direction.value,
        "handoff_state": HandoffState.QUEUED.value if direction is Direction.SENT else None,
        "state": JobState.PENDING.value,
        "peer_id": peer_id,
        "backend_id": backend_id,
        "owner_principal": owner_principal,
        "submitting_user": submitting_user,
        "nonce": nonce or uuid.uuid4().hex,
        "cancel_intent_version": 0,
        "cancel_delivered_version": 0,
        "priority_band": spec.priority_band.wire_name,
        "submitted_at_ms": now_ms,
        "scheduling_deadline_ms": spec.scheduling_deadline_ms,
        "spec": spec.model_dump(mode="json"),
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
        "log_cursor": "",
        "last_log_seq": 0,
        "origin_dag_id": origin.dag_id if origin else None,
        "origin_run_id": origin.run_id if origin else None,
        "origin_task_id": origin.task_id if origin else None,
        "origin_map_index": origin.map_index if origin else None,
    }


def _notice(connection: sa.Connection, job_id: str, nonce: str, text: str, now_ms: int) -> None:
    """A line from the federation itself in the job's relayed output (prefixed, so it is not taken
    for the job's own), which its waiting task copies into the task log."""
    seq = connection.execute(
        job_logs.insert()
        .values(job_id=job_id, nonce=nonce, at_ms=now_ms, line=f"[iris-federation] {text}")
        .returning(job_logs.c.seq)
    ).scalar_one()
    connection.execute(jobs.update().where(jobs.c.job_id == job_id).values(last_log_seq=seq, **_touched(now_ms)))


def _touched(now_ms: int) -> dict[str, Any]:
    return {"updated_at_ms": now_ms, "row_version": jobs.c.row_version + 1}


def _event(
    connection: sa.Connection,
    job_id: str,
    now_ms: int,
    kind: str,
    state: JobState | None,
    handoff: HandoffState | str | None,
    peer_id: str,
    detail: str | Direction = "",
) -> None:
    connection.execute(
        job_events.insert().values(
            job_id=job_id,
            at_ms=now_ms,
            kind=kind,
            state=state.value if state else None,
            handoff_state=str(handoff) if handoff else None,
            peer_id=peer_id,
            detail=str(detail),
        )
    )


def _promote(connection: sa.Connection, promotion: Promotion, now_ms: int) -> bool:
    promoted = connection.execute(
        jobs.update()
        .where(
            jobs.c.job_id == promotion.job_id,
            jobs.c.direction == Direction.SENT.value,
            jobs.c.handoff_state == HandoffState.QUEUED.value,
            jobs.c.cancel_intent_version == 0,
            jobs.c.state.not_in(_TERMINAL),
            jobs.c.peer_id.in_(["", promotion.peer_id]),  # a pinned job only ever goes to its pin
        )
        .values(
            handoff_state=HandoffState.PENDING.value,
            peer_id=promotion.peer_id,
            backend_id=promotion.backend_id,
            handoff_since_ms=now_ms,
            **_touched(now_ms),
        )
    ).rowcount
    if promoted:
        detail = f"backend {promotion.backend_id or '(force-routed)'}"
        if promotion.preempts:
            detail += ", reclaiming lower-band capacity"
        _event(connection, promotion.job_id, now_ms, "promoted", None, HandoffState.PENDING, promotion.peer_id, detail)
    return bool(promoted)


def _charge_ledger(connection: sa.Connection, promotion: Promotion) -> None:
    if promotion.observation_epoch_ms is None:
        return
    for token, amount in promotion.reserved.items():
        statement = _insert(connection, ledger).values(
            peer_id=promotion.peer_id,
            backend_id=promotion.backend_id,
            token=token,
            observation_epoch_ms=promotion.observation_epoch_ms,
            amount=amount,
        )
        newer = statement.excluded.observation_epoch_ms > ledger.c.observation_epoch_ms
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=["peer_id", "backend_id", "token"],
                set_={
                    # A row from an older observation is spent; the new charge replaces it.
                    "amount": sa.case(
                        (newer, statement.excluded.amount), else_=ledger.c.amount + statement.excluded.amount
                    ),
                    "observation_epoch_ms": sa.case(
                        (newer, statement.excluded.observation_epoch_ms), else_=ledger.c.observation_epoch_ms
                    ),
                },
            )
        )


def _set_terminal(
    connection: sa.Connection,
    job_id: str,
    now_ms: int,
    state: JobState,
    error: str,
    handoff: HandoffState | str | None,
    peer_id: str,
) -> bool:
    changed = connection.execute(
        jobs.update()
        .where(jobs.c.job_id == job_id, jobs.c.state.not_in(_TERMINAL))
        .values(state=state.value, error=error, finished_at_ms=now_ms, **_touched(now_ms))
    ).rowcount
    if changed:
        _event(connection, job_id, now_ms, "state", state, handoff, peer_id, error)
    return bool(changed)


def _peer_backend(record: BackendRecord) -> PeerBackend:
    block = record.availability
    availability = None
    if block is not None:
        held: dict[Any, dict[str, int]] = {}
        for entry in block.get("held_by_band", []):
            band = parse_band(entry["band"], unspecified=None)
            if band is not None:
                held[band] = dict(entry["amounts"])
        availability = Availability(
            int(block["version"]),
            int(block.get("observation_epoch_ms", 0)),
            dict(block.get("amounts", {})),
            dict(block.get("total_amounts", {})),
            held,
        )
    return PeerBackend(record.backend_id, normalize_advertised(record.attributes), availability, record.kind)

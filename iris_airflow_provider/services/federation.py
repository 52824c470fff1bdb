"""The federation operations: submit (classify and enqueue), cancel, and the placement tick.

Everything here is plain Python over the store, this cluster's backends and its peers; the
Airflow operator, sensor, trigger and DAG only call into it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    Backend,
    JobReport,
    LogChunk,
    Submission,
    SubmissionRefusedError,
)
from iris_airflow_provider.cluster.build import build_local_backends, build_peers
from iris_airflow_provider.cluster.config import ClusterConfig
from iris_airflow_provider.federation.availability import LocalBackend, PeerState
from iris_airflow_provider.federation.model import JobSpec
from iris_airflow_provider.federation.object_stores import OBJECT_STORE_KEY, mismatch_message, unreadable_paths
from iris_airflow_provider.federation.placement import Candidate, Promotion, plan
from iris_airflow_provider.federation.router import Decision, Disposition, classify
from iris_airflow_provider.federation.states import Direction, HandoffState, JobState
from iris_airflow_provider.peers.base import Handoff, Peer, PeerError, PeerErrorCode
from iris_airflow_provider.store.records import CancelOutcome, JobRecord, Origin
from iris_airflow_provider.store.store import AbandonedHandoff, FederationStore, RequeueOutcome

log = logging.getLogger(__name__)

# Who a job submitted by an unauthenticated or in-cluster caller is accountable to; never federated.
LOCAL_ADMIN = "local_admin"
DELIVERY_BACKOFF_BASE_MS = 5_000
DELIVERY_BACKOFF_MAX_MS = 300_000
# A local job is admitted to the store before its backend has it: a job never reported is only
# "gone" from its backend once its submitter has had this long to hand it over.
LOCAL_START_GRACE_MS = 60_000
# What a requeue left on a peer that is no longer configured is forgotten after this long.
ABANDONED_UNCONFIGURED_TTL_MS = 7 * 24 * 3600 * 1000
# At submit, a peer without a fresh heartbeat is asked again at most this often.
STALE_PROBE_COOLDOWN_MS = 30_000
RUN_HERE = (Direction.LOCAL, Direction.RECEIVED)  # jobs one of this cluster's backends runs
LOGGED_HANDOFFS = (HandoffState.PENDING, HandoffState.HANDED_OFF)  # handoffs a peer may have output for
LOG_LINES_PER_TICK = 500  # per job: a chatty job cannot hold up a tick
# A submitting task in one of these states has given up on its job for good (a retry is
# "up_for_retry", a cleared task has no state: both will reattach, so neither is here).
ORPHANING_TASK_STATES = frozenset({"failed", "upstream_failed"})

# (dag_id, run_ids, task_ids) -> {run_id: {task_id or "<task_id>_<map_index>": state}}, as Airflow's
# RuntimeTaskInstance.get_task_states answers.
TaskStates = Callable[[str, list[str], list[str]], Mapping[str, Mapping[str, Any]]]

T = TypeVar("T")


class IdentityError(ValueError):
    """A job that would federate has no accountable submitter."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Submitted:
    decision: Decision
    job: JobRecord | None  # None when rejected
    reattached: bool = False  # a live job with this id already existed: nothing new was submitted


@dataclass
class TickReport:
    started_at_ms: int
    heartbeats: dict[str, str] = field(default_factory=dict)  # peer -> "ok" or the error
    expired: list[str] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)  # "job->peer/backend"
    delivered: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # back to the queue from a peer that could not take them
    reported: list[str] = field(default_factory=list)  # jobs whose state changed from a report
    cancelled: list[str] = field(default_factory=list)  # cancels confirmed by whoever runs the job
    pending: int = 0
    duration_ms: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{len(self.heartbeats)} peer(s) heartbeated"]
        for name in ("expired", "promoted", "delivered", "rejected", "retrying", "requeued", "reported", "cancelled"):
            items: list[str] = getattr(self, name)
            if items:
                parts.append(f"{name} {len(items)}: {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
        parts.append(f"{self.pending} still queued")
        return "; ".join(parts) + f" ({self.duration_ms} ms)"


class Federation:
    def __init__(
        self,
        config: ClusterConfig,
        store: FederationStore,
        *,
        backends: Mapping[str, Backend],
        peers: Mapping[str, Peer],
        clock: Callable[[], int] = now_ms,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.store = store
        self.backends = dict(backends)
        self.peers = dict(peers)
        self.clock = clock
        self.jitter = jitter
        self.settings = config.placement

    @classmethod
    def of(cls, config: ClusterConfig, store: FederationStore) -> Federation:
        """The federation of a cluster file: its local backends and its peers, built from it."""
        return cls(config, store, backends=build_local_backends(config), peers=build_peers(config))

    @property
    def staleness_ms(self) -> int:
        return int(self.settings.heartbeat_staleness_seconds * 1000)

    # Submit ------------------------------------------------------------------------------------

    def local_backends(self) -> list[LocalBackend]:
        described = [backend.describe() for backend in self.backends.values()]
        return [
            LocalBackend(b.backend_id, b.advertised, dict(b.availability.total_amounts) if b.availability else None)
            for b in described
        ]

    def peer_states(self, *, refresh_stale: bool = False) -> list[PeerState]:
        """The configured peers as last heartbeated (a peer never heard from is unreachable).

        With ``refresh_stale``, peers without a fresh heartbeat are asked now (see ``refresh_stale_peers``).
        """
        if refresh_stale:
            self.refresh_stale_peers()
        known = {peer.peer_id: peer for peer in self.store.peer_states()}
        return [known.get(peer_id) or PeerState(peer_id, False, 0) for peer_id in self.peers]

    def refresh_stale_peers(self) -> bool:
        """Ask the peers without a fresh heartbeat for one now, unless they were asked in the last
        ``STALE_PROBE_COOLDOWN_MS``: a dead peer then slows one submit in a while, not every one.
        Returns whether any peer was asked."""
        now = self.clock()
        records = {record.peer_id: record for record in self.store.peers()}
        stale = {}
        for peer_id, peer in self.peers.items():
            record = records.get(peer_id)
            fresh = record is not None and record.is_reachable(now, self.staleness_ms)
            asked_lately = (
                record is not None
                and record.last_attempt_ms is not None
                and (now - record.last_attempt_ms < STALE_PROBE_COOLDOWN_MS)
            )
            if not fresh and not asked_lately:
                stale[peer_id] = peer
        if stale:
            self._record_heartbeats(stale)
        return bool(stale)

    def classify(self, spec: JobSpec) -> Decision:
        """Classify on what the peers last said; a job that would be rejected is classified again
        after asking stale peers, so a job submitted right after a restart (before the first tick)
        is not rejected for want of a heartbeat. Local and queued jobs never wait for a peer."""
        decision = self._classify(spec)
        if decision.disposition is Disposition.REJECT and self.refresh_stale_peers():
            decision = self._classify(spec)
        return decision

    def _classify(self, spec: JobSpec) -> Decision:
        return classify(
            spec,
            local_backends=self.local_backends(),
            peers=self.peer_states(),
            now_ms=self.clock(),
            staleness_ms=self.staleness_ms,
        )

    def submit(
        self, spec: JobSpec, *, submitting_user: str, origin: Origin | None = None, owner_principal: str = ""
    ) -> Submitted:
        """Classify a whole job and enqueue it (QUEUE), start it here (LOCAL), or say why not (REJECT).

        Idempotent per job id: while a job with this id is live, submitting it again reattaches to
        it; once it has finished, submitting runs it again as a new incarnation.
        """
        spec = spec.with_default_region(self.config.default_region)
        existing = self.store.get_job(spec.job_id)
        if existing is not None and not existing.terminal:
            return Submitted(_decision_of(existing), existing, reattached=True)
        decision = self.classify(spec)
        if decision.disposition is Disposition.REJECT:
            return Submitted(decision, None)
        if decision.disposition is Disposition.QUEUE and submitting_user in ("", LOCAL_ADMIN):
            raise IdentityError(
                f"Job {spec.job_id} would run on a peer cluster, which needs an accountable submitter, "
                "and this run has none: trigger it as a logged-in user (UI or REST API), or set "
                "submitter='someone@example.com' on the operator for scheduled runs."
            )
        local = decision.disposition is Disposition.LOCAL
        direction = Direction.LOCAL if local else Direction.SENT
        now = self.clock()
        arguments: dict[str, Any] = {
            "direction": direction,
            "now_ms": now,
            "submitting_user": submitting_user,
            "owner_principal": owner_principal or submitting_user,
            "peer_id": decision.pinned_peer_id,
            "backend_id": decision.local_backend_id,
            "origin": origin,
        }
        if existing is not None:
            record = self.store.reincarnate(spec, **arguments)
        else:
            admission = self.store.admit(spec, **arguments)
            record = admission.job if admission.created else None
        if record is None:  # someone else submitted it between our read and our write: join them
            current = self.store.get_job(spec.job_id)
            return Submitted(_decision_of(current) if current else decision, current, reattached=True)
        if local:
            self._start_local(record, spec)
            record = self.store.get_job(spec.job_id) or record
        log.info("Job %s: %s", spec.job_id, _describe_decision(decision))
        return Submitted(decision, record)

    def start_received(self, job_id: str, nonce: str) -> JobRecord:
        """Start a job a peer handed us on the backend chosen at admission (idempotent by nonce)."""
        record = self.store.get_job(job_id)
        if record is None or record.direction is not Direction.RECEIVED or record.nonce != nonce:
            raise KeyError(f"Job {job_id} (incarnation {nonce}) was not handed to this cluster, or was replaced")
        if not record.terminal:
            self._start_local(record, record.job_spec)
        return self.store.get_job(job_id) or record

    def _start_local(self, record: JobRecord, spec: JobSpec) -> None:
        backend = self.backends[record.backend_id]
        submission = Submission(record.job_id, record.nonce, spec, record.peer_id, record.submitted_at_ms)
        try:
            report = backend.submit(submission).report
        except (SubmissionRefusedError, AlreadyExistsError) as error:
            self.store.transition(record.job_id, to_state=JobState.FAILED, now_ms=self.clock(), error=str(error))
            return
        current = self.store.get_job(record.job_id)
        if current is not None and current.nonce == record.nonce and current.cancel_requested:
            backend.cancel(record.job_id)  # a cancel landed while we were starting it: honour it
        self._apply_report(record, report)

    # Cancel ------------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job: before handoff it never reaches a peer; after, the peer is told (and re-told)."""
        outcome = self.store.request_cancel(job_id, self.clock())
        # A queued job has no peer to tell (not even its pin): only local jobs and handoffs that
        # may have reached a peer (``notify_peer``) are routed, as the re-drive does.
        routed = outcome.direction in RUN_HERE or bool(outcome.notify_peer)
        if outcome.found and not outcome.was_terminal and routed:
            record = self.store.get_job(job_id)
            if record is not None:
                self._deliver_cancel(record)
        return outcome

    def _deliver_cancel(self, record: JobRecord) -> bool:
        try:
            if record.direction in RUN_HERE:
                backend = self.backends.get(record.backend_id)
                found = backend.cancel(record.job_id) if backend is not None else False
            else:
                peer = self.peers.get(record.peer_id)
                if peer is None:
                    return False
                found = peer.cancel(record.job_id)
        except (PeerError, OSError) as error:
            log.warning("Cancel of %s could not be delivered yet (will retry): %s", record.job_id, error)
            return False
        if not found:
            self.store.mark_gone(record.job_id, record.nonce, self.clock())
        self.store.confirm_cancel(record.job_id, record.nonce, record.cancel_intent_version, self.clock())
        return True

    # The tick ----------------------------------------------------------------------------------

    def tick(self, *, task_states: TaskStates | None = None) -> TickReport:
        """Heartbeats, expiry, placement, delivery, status sync, cancel re-drive: one pass of each.

        With ``task_states`` (Airflow's view of the tasks that submitted jobs), jobs whose task has
        failed are cancelled first: a safety net for a task killed before its trigger ever ran,
        whose job would otherwise wait, and maybe run, with nobody waiting for it.
        """
        report = TickReport(started_at_ms=self.clock())
        if task_states is not None:
            self._cancel_orphans(task_states, report)
        self._heartbeats(report)
        self.store.prune_ledger()
        report.expired = self.store.expire_queued(self.clock())
        self._place(report)
        self._deliver(report)
        in_flight = self._sync(report)
        self._relay_logs(in_flight)
        self._redrive_cancels(report)
        self._terminate_abandoned(report)
        report.duration_ms = self.clock() - report.started_at_ms
        log.info("Federation tick: %s", report.summary())
        return report

    def _cancel_orphans(self, task_states: TaskStates, report: TickReport) -> None:
        by_dag: dict[str, list[JobRecord]] = defaultdict(list)
        for job in self.store.live_jobs_with_origin():
            if job.origin is not None and not job.cancel_requested:
                by_dag[job.origin.dag_id].append(job)
        for dag_id, jobs in by_dag.items():
            origins = [job.origin for job in jobs if job.origin is not None]
            try:
                states = task_states(dag_id, sorted({o.run_id for o in origins}), sorted({o.task_id for o in origins}))
            except Exception as error:  # Airflow's API is down: the next tick asks again
                log.warning("Could not read the states of %s's tasks: %s", dag_id, error)
                continue
            for job in jobs:
                origin = job.origin
                assert origin is not None
                key = origin.task_id if origin.map_index < 0 else f"{origin.task_id}_{origin.map_index}"
                state = states.get(origin.run_id, {}).get(key)
                if state in ORPHANING_TASK_STATES:
                    log.warning(
                        "Cancelling job %s: the task that submitted it (%s/%s/%s) is %s",
                        job.job_id,
                        dag_id,
                        origin.run_id,
                        key,
                        state,
                    )
                    self.cancel(job.job_id)
                    report.cancelled.append(job.job_id)

    def _heartbeats(self, report: TickReport) -> None:
        report.heartbeats = self._record_heartbeats(self.peers)
        self.store.forget_peers(self.peers)

    def _record_heartbeats(self, peers: Mapping[str, Peer]) -> dict[str, str]:
        """Ask each peer for its backends and store the answer (or that it did not answer)."""
        results = _each_peer(peers, lambda peer: peer.heartbeat(), self.settings.heartbeat_timeout_seconds)
        now = self.clock()
        outcome = {}
        for peer_id, result in results.items():
            if isinstance(result, BaseException):
                self.store.record_heartbeat(peer_id, now, None, error=str(result))
                outcome[peer_id] = str(result)
            else:
                self.store.record_heartbeat(peer_id, now, result)
                outcome[peer_id] = "ok"
        return outcome

    def candidates(self, queued: Iterable[JobRecord], now_ms: int) -> list[Candidate]:
        """Queued jobs as the placement pass sees them at ``now_ms``. A job avoids the peers it was
        requeued from for a while, and any peer still to be told to drop what it left there: a new
        delivery would meet that earlier incarnation still running."""
        leftovers: dict[str, set[str]] = defaultdict(set)
        for handoff in self.store.abandoned_handoffs():
            leftovers[handoff.job_id].add(handoff.peer_id)
        return [
            Candidate.from_job(
                job.job_spec, job.submitted_at_ms, {*job.avoided_peer_ids(now_ms), *leftovers.get(job.job_id, ())}
            )
            for job in queued
        ]

    def _place(self, report: TickReport) -> None:
        now = self.clock()
        queued = {job.job_id: job for job in self.store.queued_jobs()}
        peer_states = self.store.peer_states()
        result = plan(
            self.candidates(queued.values(), now),
            peer_states,
            self.store.ledger(),
            now_ms=self.clock(),
            max_per_peer=self.settings.max_handoffs_per_cycle,
            staleness_ms=self.staleness_ms,
        )
        confirmed = self.store.apply_promotions(result.promotions, self.clock())
        report.promoted = [f"{p.job_id}->{p.peer_id}/{p.backend_id or '*'}" for p in confirmed]
        report.pending = len(result.pending)
        if confirmed:
            log.info("Federation: promoted %d queued job(s): %s", len(confirmed), ", ".join(report.promoted))
        advertised = {(p.peer_id, b.backend_id): b.advertised for p in peer_states for b in p.backends}
        for promotion in confirmed:
            self._flag_unreadable_paths(queued[promotion.job_id], promotion, advertised)

    def _flag_unreadable_paths(
        self, job: JobRecord, promotion: Promotion, advertised: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> None:
        """Before the handoff: say so when the job names object-store paths its backend cannot read."""
        attributes = advertised.get((promotion.peer_id, promotion.backend_id), {})
        paths = unreadable_paths(job.job_spec, attributes)
        if paths:
            target = f"peer {promotion.peer_id} (backend {promotion.backend_id})"
            message = mismatch_message(job.job_id, target, paths, attributes[OBJECT_STORE_KEY])
            log.warning("%s", message)
            self.store.flag(
                job.job_id, job.nonce, "object_store_mismatch", message, self.clock(), peer_id=promotion.peer_id
            )

    def _deliver(self, report: TickReport) -> None:
        by_peer: dict[str, list[JobRecord]] = defaultdict(list)
        for job in self.store.pending_handoffs(self.clock()):
            by_peer[job.peer_id].append(job)

        def deliver_all(peer: Peer) -> list[tuple[JobRecord, JobReport | PeerError]]:
            outcomes: list[tuple[JobRecord, JobReport | PeerError]] = []
            for job in by_peer[peer.peer_id]:
                handoff = Handoff(
                    job_id=job.job_id,
                    nonce=job.nonce,
                    spec=job.job_spec,
                    backend_id=job.backend_id,
                    requester=self.config.name,
                    owner_principal=job.owner_principal,
                    submitting_user=job.submitting_user,
                    submitted_at_ms=job.submitted_at_ms,
                )
                try:
                    outcomes.append((job, peer.deliver(handoff)))
                except PeerError as error:
                    outcomes.append((job, error))
            return outcomes

        targets = {peer_id: self.peers[peer_id] for peer_id in by_peer if peer_id in self.peers}
        for peer_id, jobs in by_peer.items():
            if peer_id not in self.peers:  # removed from the configuration since the promotion
                for job in jobs:
                    self._delivery_failed(job, f"peer {peer_id} is not configured", report, hopeless=True)
        results = _each_peer(targets, deliver_all, self.settings.delivery_timeout_seconds)
        for peer_id, result in results.items():
            if isinstance(result, BaseException):
                for job in by_peer[peer_id]:
                    self._delivery_failed(job, str(result), report)
                continue
            for job, outcome in result:
                if isinstance(outcome, JobReport):
                    self.store.mark_handed_off(job.job_id, job.nonce, self.clock())
                    self._apply_report(job, outcome)
                    report.delivered.append(job.job_id)
                elif outcome.terminal:
                    self.store.reject_handoff(job.job_id, job.nonce, outcome.message, self.clock())
                    report.rejected.append(job.job_id)
                else:
                    self._delivery_failed(job, str(outcome), report, hopeless=outcome.requeues)

    def _delivery_failed(self, job: JobRecord, error: str, report: TickReport, *, hopeless: bool = False) -> None:
        """Retry later on the same peer; or, for an unpinned job the peer cannot take (``hopeless``)
        or has failed to take for ``requeue_after_seconds``, back to the queue to try another."""
        failing_for = self.clock() - (job.handoff_since_ms or self.clock())
        if not job.job_spec.pin and (hopeless or failing_for >= self.settings.requeue_after_seconds * 1000):
            self._requeue(job, error, report)
        else:
            self._retry_delivery(job, error, report)

    def _requeue(self, job: JobRecord, error: str, report: TickReport) -> None:
        now = self.clock()
        outcome = self.store.requeue_handoff(
            job.job_id,
            job.nonce,
            peer_id=job.peer_id,
            reason=error,
            avoid_until_ms=now + int(self.settings.requeue_avoid_seconds * 1000),
            max_requeues=self.settings.max_requeues,
            now_ms=now,
        )
        if outcome is RequeueOutcome.REQUEUED:
            log.warning("Requeued %s: peer %s could not take it: %s", job.job_id, job.peer_id, error)
            report.requeued.append(job.job_id)
        elif outcome is RequeueOutcome.EXHAUSTED:
            log.warning("Gave up on %s after %d requeue(s): %s", job.job_id, job.requeue_count, error)
            report.rejected.append(job.job_id)

    def _retry_delivery(self, job: JobRecord, error: str, report: TickReport) -> None:
        backoff = min(DELIVERY_BACKOFF_MAX_MS, DELIVERY_BACKOFF_BASE_MS * 2 ** min(job.delivery_attempts, 16))
        delay = int(backoff * (0.5 + self.jitter() / 2))  # jitter: peers recovering are not hit in lockstep
        now = self.clock()
        self.store.defer_delivery(job.job_id, job.nonce, error, now + delay, now)
        log.warning(
            "Handoff of %s to peer %s failed (will retry in %d s): %s", job.job_id, job.peer_id, delay // 1000, error
        )
        report.retrying.append(job.job_id)

    def _sync(self, report: TickReport) -> list[JobRecord]:
        """Take in what peers and local backends report; returns the jobs that were in flight."""
        in_flight = self.store.in_flight()
        sent: dict[str, list[JobRecord]] = defaultdict(list)
        local: list[JobRecord] = []
        for job in in_flight:
            if job.direction in RUN_HERE:
                local.append(job)
            elif job.peer_id in self.peers:
                sent[job.peer_id].append(job)

        def sync_peer(peer: Peer) -> Any:
            ids = [job.job_id for job in sent[peer.peer_id]]
            return peer.sync(ids, self.store.sync_cursor(peer.peer_id))

        results = _each_peer({p: self.peers[p] for p in sent}, sync_peer, self.settings.heartbeat_timeout_seconds)
        for peer_id, result in results.items():
            if isinstance(result, BaseException):
                log.warning("Status sync with peer %s failed: %s", peer_id, result)
                continue
            for job in sent[peer_id]:
                if self._apply_sync(job, result.reports.get(job.job_id), job.job_id in result.gone):
                    report.reported.append(job.job_id)
            self.store.save_sync_cursor(peer_id, result.cursor, self.clock())
        for job in local:
            backend = self.backends.get(job.backend_id)
            if backend is None:
                continue
            job_report = backend.status(job.job_id)
            if job_report is None:
                if job.reported_at_ms is None and (
                    job.direction is Direction.RECEIVED  # its runner task starts it, whenever Airflow runs that
                    or self.clock() - job.submitted_at_ms < LOCAL_START_GRACE_MS  # a concurrent submit
                ):
                    continue
                if self.store.mark_gone(job.job_id, job.nonce, self.clock()):
                    report.reported.append(job.job_id)
            elif self._apply_report(job, job_report):
                report.reported.append(job.job_id)
        return in_flight

    def _log_reader(self, job: JobRecord) -> Callable[[JobRecord], LogChunk] | None:
        """How to read the job's new output from whoever runs it (None when nobody does yet)."""
        if job.direction in RUN_HERE and job.backend_id in self.backends:
            backend = self.backends[job.backend_id]
            return lambda j: backend.logs(j.job_id, j.log_cursor, LOG_LINES_PER_TICK)
        if job.direction is Direction.SENT and job.peer_id in self.peers and job.handoff_state in LOGGED_HANDOFFS:
            peer = self.peers[job.peer_id]
            return lambda j: peer.logs(j.job_id, j.log_cursor, LOG_LINES_PER_TICK)
        return None

    def _relay_logs(self, jobs: list[JobRecord]) -> None:
        """Copy new output of jobs in flight into the store, for their waiting tasks; peers in parallel."""
        by_peer: dict[str, list[JobRecord]] = defaultdict(list)
        for job in self.store.get_jobs(j.job_id for j in jobs).values():  # fresh cursors
            reader = self._log_reader(job)
            if reader is None or job.terminal:
                continue  # a job that just finished had its last output relayed before its end
            if job.direction is Direction.SENT:
                by_peer[job.peer_id].append(job)
            else:
                self._relay(job, reader)

        def relay_peer(peer: Peer) -> None:
            for job in by_peer[peer.peer_id]:
                self._relay(job, lambda j: peer.logs(j.job_id, j.log_cursor, LOG_LINES_PER_TICK))

        for peer_id, result in _each_peer(
            {p: self.peers[p] for p in by_peer}, relay_peer, self.settings.heartbeat_timeout_seconds
        ).items():
            if isinstance(result, BaseException):
                log.info("Could not relay output from peer %s this tick: %s", peer_id, result)

    def _relay(self, job: JobRecord, read: Callable[[JobRecord], LogChunk]) -> None:
        try:
            chunk = read(job)
        except (PeerError, OSError, ValueError) as error:  # ValueError: a malformed answer (pydantic's too)
            log.info("Could not relay output of %s this tick: %s", job.job_id, error)
            return
        if chunk.lines or chunk.next_cursor != job.log_cursor:
            self.store.append_logs(job.job_id, job.nonce, chunk.lines, chunk.next_cursor, self.clock())

    def _apply_sync(self, job: JobRecord, job_report: JobReport | None, gone: bool) -> bool:
        if job_report is not None:
            return self._apply_report(job, job_report)
        # Only a handed-off job can be gone: a pending one may simply not have arrived yet.
        if gone and job.handoff_state is HandoffState.HANDED_OFF:
            return self.store.mark_gone(job.job_id, job.nonce, self.clock())
        return False

    def _apply_report(self, job: JobRecord, job_report: JobReport) -> bool:
        if job_report.nonce != job.nonce:
            return False  # another incarnation's news
        if job_report.state.terminal and not job.terminal:
            # Its last output first: a task waiting on the job then has all of it when it sees the end.
            reader = self._log_reader(job)
            if reader is not None:
                self._relay(job, reader)
        return self.store.mirror(
            job.job_id,
            nonce=job.nonce,
            state=job_report.state,
            now_ms=self.clock(),
            backend_id=job_report.backend_id,
            error=job_report.error,
            exit_code=job_report.exit_code,
            started_at_ms=job_report.started_at_ms,
            finished_at_ms=job_report.finished_at_ms,
        )

    def _redrive_cancels(self, report: TickReport) -> None:
        for job in self.store.pending_cancels():
            if self._deliver_cancel(job):
                report.cancelled.append(job.job_id)

    def _terminate_abandoned(self, report: TickReport) -> None:
        """Stop incarnations a requeue left behind on peers that may have admitted them; peers in parallel."""
        by_peer: dict[str, list[AbandonedHandoff]] = defaultdict(list)
        now = self.clock()
        for handoff in self.store.abandoned_handoffs():
            if handoff.peer_id in self.peers:
                by_peer[handoff.peer_id].append(handoff)
            elif now - handoff.abandoned_at_ms > ABANDONED_UNCONFIGURED_TTL_MS:
                # A peer removed from the configuration cannot be asked; after a week, stop waiting for it.
                self.store.forget_abandoned(handoff, now, terminated=False)

        def terminate_all(peer: Peer) -> None:
            for handoff in by_peer[peer.peer_id]:
                terminated = peer.cancel(handoff.job_id, handoff.nonce)  # a PeerError: asked again next tick
                self.store.forget_abandoned(handoff, self.clock(), terminated=terminated)
                if terminated:
                    log.warning("Terminated %s on peer %s, left there by a requeue", handoff.job_id, peer.peer_id)
                    report.cancelled.append(handoff.job_id)

        for peer_id, result in _each_peer(
            {p: self.peers[p] for p in by_peer}, terminate_all, self.settings.heartbeat_timeout_seconds
        ).items():
            if isinstance(result, BaseException):
                log.info("Could not reach peer %s about jobs left there by a requeue: %s", peer_id, result)


def _decision_of(job: JobRecord) -> Decision:
    if job.direction is Direction.SENT:
        return Decision(
            Disposition.QUEUE, pinned_peer_id=job.peer_id if job.handoff_state is HandoffState.QUEUED else ""
        )
    return Decision(Disposition.LOCAL, local_backend_id=job.backend_id)


def _describe_decision(decision: Decision) -> str:
    if decision.disposition is Disposition.LOCAL:
        return f"runs locally on backend {decision.local_backend_id}"
    if decision.pinned_peer_id:
        return f"queued for peer {decision.pinned_peer_id}"
    return "queued for a federation peer"


def _each_peer(peers: Mapping[str, Peer], call: Callable[[Peer], T], timeout_s: float) -> dict[str, T | BaseException]:
    """Call each peer in parallel; a slow or failing peer never holds up the others."""
    if not peers:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(16, len(peers)), thread_name_prefix="iris-peer")
    futures = {peer_id: pool.submit(call, peer) for peer_id, peer in peers.items()}
    results: dict[str, T | BaseException] = {}
    deadline = time.monotonic() + timeout_s
    for peer_id, future in futures.items():
        try:
            results[peer_id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            results[peer_id] = PeerError(
                PeerErrorCode.UNAVAILABLE, f"peer {peer_id} did not answer within {timeout_s:g} s"
            )
        except Exception as error:  # one peer's bug must not stop the tick for the others
            results[peer_id] = error
    pool.shutdown(wait=False, cancel_futures=True)
    return results

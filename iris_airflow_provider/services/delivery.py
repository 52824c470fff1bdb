"""Delivering promoted jobs to their peers, and carrying out what a failed delivery leads to.

Each peer gets its pending handoffs in one thread (peers in parallel, bounded by the delivery
timeout). Each delivery is claimed in the store before its call (so a cancel knows it may still
land, and no other tick delivers it meanwhile) and records its own outcome when the call returns,
even after the tick stopped waiting for it: a peer that admits a job late is never forgotten. The
round's claims are one transaction, and so are the admissions it saw (each row still conditional). A
delivery that fails is judged by :mod:`iris_airflow_provider.core.handoff_policy`: retry later on
the same peer, back to the queue, or reject; this module only carries that out.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

from iris_airflow_provider.backends.base import JobReport
from iris_airflow_provider.core.cancel_settlement import claim_stale_before
from iris_airflow_provider.core.handoff_policy import (
    DeliveryError,
    Reject,
    Requeue,
    RequeueRules,
    Retry,
    after_delivery_error,
)
from iris_airflow_provider.core.job_report import projected
from iris_airflow_provider.peers.base import Handoff, Peer, PeerError
from iris_airflow_provider.services.fanout import each_peer
from iris_airflow_provider.services.ports import DeliveryStore
from iris_airflow_provider.store.records import Admitted, HandoffRefusal, JobRecord
from iris_airflow_provider.store.store import RequeueOutcome

log = logging.getLogger(__name__)


@dataclass
class Delivered:
    """What one delivery round did, by job id."""

    delivered: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)


def error_kind(error: PeerError) -> DeliveryError:
    if error.terminal:
        return DeliveryError.REFUSED
    return DeliveryError.CANNOT_TAKE if error.requeues else DeliveryError.TRANSIENT


Outcome = JobReport | Exception  # what a delivery call returned, or raised


class _Batch:
    """One peer's deliveries of a round, shared by its thread (which makes the calls) and the tick
    (which records what they did). Each outcome is recorded exactly once: by the tick when the call
    returned before the tick stopped waiting, else by the thread when it does."""

    def __init__(self, jobs: list[JobRecord]) -> None:
        self.jobs = jobs
        self.lock = threading.Lock()
        self.given_up = False
        self.in_flight: JobRecord | None = None
        self.done: list[tuple[JobRecord, Outcome]] = []  # for the tick to record

    def start(self, job: JobRecord) -> bool:
        with self.lock:
            if self.given_up:
                return False
            self.in_flight = job
            return True

    def finish(self, job: JobRecord, outcome: Outcome) -> bool:
        """Whether the tick records this outcome (False: it stopped waiting; the thread records it)."""
        with self.lock:
            self.in_flight = None
            if self.given_up:
                return False
            self.done.append((job, outcome))
            return True

    def give_up(self) -> tuple[JobRecord | None, list[JobRecord]]:
        """The tick stops waiting: the call still in flight, and the jobs never started."""
        with self.lock:
            self.given_up = True
            finished = {job.job_id for job, _ in self.done}
            in_flight = self.in_flight
            started = finished | ({in_flight.job_id} if in_flight else set())
            return in_flight, [job for job in self.jobs if job.job_id not in started]


@dataclass(eq=False)  # a service, compared by identity
class Delivery:
    store: DeliveryStore
    _: KW_ONLY
    cluster: str
    peers: Mapping[str, Peer]
    clock: Callable[[], int]
    jitter: Callable[[], float]
    rules: RequeueRules
    max_requeues: int
    timeout_s: float
    apply_reports: Callable[[Sequence[tuple[JobRecord, JobReport]]], set[str]]

    def deliver(self) -> Delivered:
        """Hand every pending handoff due now to its peer."""
        done = Delivered()
        by_peer: dict[str, list[JobRecord]] = defaultdict(list)
        now = self.clock()
        stale_before = claim_stale_before(now, int(self.timeout_s * 1000))
        claimable = []
        for job in self.store.pending_handoffs(now):
            if job.peer_id not in self.peers:  # removed from the configuration since the promotion
                self.failed(job, DeliveryError.CANNOT_TAKE, f"peer {job.peer_id} is not configured", done)
            else:
                claimable.append(job)
        # Claimed before their calls (none for a job cancelled since, or one another tick delivers):
        # a cancel then knows it may still land. One transaction for all of them.
        incarnations = [(job.job_id, job.nonce) for job in claimable]
        claimed = self.store.begin_deliveries(incarnations, now, stale_before_ms=stale_before)
        for job in claimable:
            if job.job_id in claimed:
                by_peer[job.peer_id].append(job)
        batches = {peer_id: _Batch(jobs) for peer_id, jobs in by_peer.items()}

        def deliver_all(peer: Peer) -> None:
            batch = batches[peer.peer_id]
            for job in batch.jobs:
                if not batch.start(job):
                    return  # the tick has moved on: the rest waits for the next one
                outcome: Outcome
                try:
                    outcome = peer.deliver(self._handoff(job))
                except Exception as error:  # a PeerError, or a bug in the peer client: retried as transient
                    outcome = error
                if not batch.finish(job, outcome):
                    self._landed_late(job, outcome)

        results = each_peer({peer_id: self.peers[peer_id] for peer_id in batches}, deliver_all, self.timeout_s)
        admitted: list[tuple[JobRecord, JobReport]] = []
        for peer_id, result in results.items():
            batch = batches[peer_id]
            if isinstance(result, BaseException):
                in_flight, never_started = batch.give_up()
                if in_flight is not None:  # still in the peer: its claim stays until its call returns
                    self.failed(in_flight, DeliveryError.TRANSIENT, str(result), done)
                for job in never_started:
                    self.failed(job, DeliveryError.TRANSIENT, str(result), done)
                    self.store.release_delivery(job.job_id, job.nonce)
            for job, outcome in batch.done:
                if isinstance(outcome, JobReport):
                    admitted.append((job, outcome))
                else:
                    self._record_failure(job, outcome, done)
        self._record_admitted(admitted, done)
        return done

    def _record_admitted(self, admitted: list[tuple[JobRecord, JobReport]], done: Delivered) -> None:
        """The peers admitted these jobs: each handed off (conditionally), then its report mirrored;
        one transaction for the marks, one for the reports."""
        marks = [Admitted(job.job_id, job.nonce, job.peer_id) for job, _ in admitted]
        handed_off = self.store.mark_handed_off_many(marks, self.clock())
        reported = [(job, report) for job, report in admitted if job.job_id in handed_off]
        self.apply_reports(reported)
        done.delivered += [job.job_id for job, _ in reported]

    def _record_failure(self, job: JobRecord, outcome: Exception, done: Delivered) -> None:
        if isinstance(outcome, PeerError):
            kind = error_kind(outcome)
            self.failed(job, kind, outcome.message if kind is DeliveryError.REFUSED else str(outcome), done)
        else:
            self.failed(job, DeliveryError.TRANSIENT, str(outcome), done)
        self.store.release_delivery(job.job_id, job.nonce)

    def _landed_late(self, job: JobRecord, outcome: Outcome) -> None:
        """A call the tick stopped waiting for returned: the peer has the job (recorded whatever the
        tick concluded meanwhile), or it failed (nothing more in flight)."""
        if isinstance(outcome, JobReport):
            self.store.mark_handed_off(job.job_id, job.nonce, self.clock(), peer_id=job.peer_id)
        else:
            self.store.release_delivery(job.job_id, job.nonce)

    def _handoff(self, job: JobRecord) -> Handoff:
        return projected(job, Handoff, spec=job.job_spec, requester=self.cluster)

    def failed(self, job: JobRecord, kind: DeliveryError, error: str, done: Delivered) -> None:
        """Carry out what the handoff policy decides for ``job``, whose delivery failed with ``error``."""
        now = self.clock()
        decision = after_delivery_error(
            kind,
            error,
            pinned=bool(job.job_spec.pin),
            failing_since_ms=job.handoff_since_ms,
            attempts=job.delivery_attempts,
            now_ms=now,
            jitter=self.jitter(),
            rules=self.rules,
        )
        if isinstance(decision, Reject):
            self.store.reject_handoff(job.job_id, job.nonce, decision.message, now)
            done.rejected.append(job.job_id)
        elif isinstance(decision, Requeue):
            self._requeue(job, error, decision, now, done)
        elif isinstance(decision, Retry):
            self.store.defer_delivery(job.job_id, job.nonce, error, decision.at_ms, now)
            log.warning(
                "Handoff of %s to peer %s failed (will retry in %d s): %s",
                job.job_id,
                job.peer_id,
                decision.delay_ms // 1000,
                error,
            )
            done.retrying.append(job.job_id)

    def _requeue(self, job: JobRecord, error: str, decision: Requeue, now: int, done: Delivered) -> None:
        refusal = HandoffRefusal(job.job_id, job.nonce, job.peer_id, error, decision.avoid_until_ms)
        outcome = self.store.requeue_handoff(refusal, max_requeues=self.max_requeues, now_ms=now)
        if outcome is RequeueOutcome.REQUEUED:
            log.warning("Requeued %s: peer %s could not take it: %s", job.job_id, job.peer_id, error)
            done.requeued.append(job.job_id)
        elif outcome is RequeueOutcome.EXHAUSTED:
            log.warning("Gave up on %s after %d requeue(s): %s", job.job_id, job.requeue_count, error)
            done.rejected.append(job.job_id)

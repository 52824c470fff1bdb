"""Delivering promoted jobs to their peers, and carrying out what a failed delivery leads to.

Each peer gets its pending handoffs in one thread (peers in parallel, bounded by the delivery
timeout). A delivery that fails is judged by :mod:`iris_airflow_provider.core.handoff_policy`:
retry later on the same peer, back to the queue, or reject; this module only carries that out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field

from iris_airflow_provider.backends.base import JobReport
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
from iris_airflow_provider.store.records import HandoffRefusal, JobRecord
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
    apply_report: Callable[[JobRecord, JobReport], bool]

    def deliver(self) -> Delivered:
        """Hand every pending handoff due now to its peer."""
        done = Delivered()
        by_peer: dict[str, list[JobRecord]] = defaultdict(list)
        for job in self.store.pending_handoffs(self.clock()):
            by_peer[job.peer_id].append(job)

        def deliver_all(peer: Peer) -> list[tuple[JobRecord, JobReport | PeerError]]:
            outcomes: list[tuple[JobRecord, JobReport | PeerError]] = []
            for job in by_peer[peer.peer_id]:
                try:
                    outcomes.append((job, peer.deliver(self._handoff(job))))
                except PeerError as error:
                    outcomes.append((job, error))
            return outcomes

        targets = {peer_id: self.peers[peer_id] for peer_id in by_peer if peer_id in self.peers}
        for peer_id, jobs in by_peer.items():
            if peer_id not in self.peers:  # removed from the configuration since the promotion
                for job in jobs:
                    self.failed(job, DeliveryError.CANNOT_TAKE, f"peer {peer_id} is not configured", done)
        for peer_id, result in each_peer(targets, deliver_all, self.timeout_s).items():
            if isinstance(result, BaseException):
                for job in by_peer[peer_id]:
                    self.failed(job, DeliveryError.TRANSIENT, str(result), done)
                continue
            for job, outcome in result:
                if isinstance(outcome, JobReport):
                    self.store.mark_handed_off(job.job_id, job.nonce, self.clock())
                    self.apply_report(job, outcome)
                    done.delivered.append(job.job_id)
                else:
                    kind = error_kind(outcome)
                    self.failed(job, kind, outcome.message if kind is DeliveryError.REFUSED else str(outcome), done)
        return done

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

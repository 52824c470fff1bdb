"""Settling the jobs of lost peers: a peer unreachable for ``placement.peer_lost_seconds``, or removed
from the cluster file (lost at once). What becomes of each job is the core's rule
(:mod:`iris_airflow_provider.core.peer_loss`); this module finds the lost peers and their jobs and
has the store carry each decision out. The incarnation left on a lost peer is terminated there by
its nonce if the peer answers again (:mod:`iris_airflow_provider.services.abandoned`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import KW_ONLY, dataclass, field

from iris_airflow_provider.core.peer_loss import LostEnd, OnPeerLost, after_peer_lost, loss_reason, peer_is_lost
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.ports import LostPeerStore
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.requeue import RequeueOutcome

log = logging.getLogger(__name__)


@dataclass
class Settled:
    """What settling lost peers did, by job id."""

    failed: list[str] = field(default_factory=list)  # ended (failed, killed or unschedulable)
    requeued: list[str] = field(default_factory=list)


@dataclass(eq=False)  # a service, compared by identity
class LostPeers:
    store: LostPeerStore
    _: KW_ONLY
    peer_ids: Collection[str]  # the configured peers
    clock: Callable[[], int]
    peer_lost_ms: int
    avoid_ms: int
    max_requeues: int

    def lost(self, now_ms: int) -> dict[str, str]:
        """The lost peers named by live jobs, with why each counts as lost."""
        named = self.store.live_handoff_peers()
        unreachable = {record.peer_id: record.unreachable_since_ms for record in self.store.peers()}
        lost = {}
        for peer_id in sorted(named):
            configured = peer_id in self.peer_ids
            if not configured or peer_is_lost(unreachable.get(peer_id), now_ms, self.peer_lost_ms):
                lost[peer_id] = loss_reason(peer_id, configured=configured, peer_lost_ms=self.peer_lost_ms)
        return lost

    def settle(self) -> Settled:
        """Settle every live job on a lost peer, and end queued jobs pinned to a removed one."""
        now = self.clock()
        settled = Settled()
        lost = self.lost(now)
        if not lost:
            return settled
        for job in self.store.handoffs_on(lost):
            self._settle(job, lost[job.peer_id], now, settled)
        removed = [peer_id for peer_id in lost if peer_id not in self.peer_ids]
        for job in self.store.queued_pinned_to(removed):
            if self.store.fail_pinned_to_removed(job, now):
                log.warning(
                    "Job %s is pinned to peer %s, which was removed from the cluster file", job.job_id, job.peer_id
                )
                settled.failed.append(job.job_id)
        return settled

    def _settle(self, job: JobRecord, reason: str, now: int, settled: Settled) -> None:
        spec = job.job_spec
        decision = after_peer_lost(
            reason,
            state=job.state,
            started=job.started,
            pinned=bool(spec.pin),
            cancel_requested=job.cancel_requested,
            policy=OnPeerLost(spec.on_peer_lost),
        )
        outcome = self.store.settle_lost(
            job, decision, now_ms=now, avoid_until_ms=now + self.avoid_ms, max_requeues=self.max_requeues
        )
        if outcome is None:
            return  # it changed since it was read: judged again next tick
        log.warning("Job %s on lost peer %s: %s (%s)", job.job_id, job.peer_id, outcome, reason)
        if isinstance(decision, LostEnd) or outcome is RequeueOutcome.EXHAUSTED or isinstance(outcome, JobState):
            settled.failed.append(job.job_id)
        elif outcome is RequeueOutcome.REQUEUED:
            settled.requeued.append(job.job_id)

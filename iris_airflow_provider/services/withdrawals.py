"""Withdrawing jobs a live peer accepted but has not started within the start timeout
(:mod:`iris_airflow_provider.core.start_timeout`): unless pinned, each is terminated there by its
nonce and, only once the peer confirms, goes back to the queue under a new nonce, avoiding that
peer. A withdrawal survives restarts and lost answers: it is marked in the store first, and the
terminate is re-sent on every tick until the peer answers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.start_timeout import start_overdue, start_timeout_ms
from iris_airflow_provider.peers.base import PeerError, Termination
from iris_airflow_provider.services.ports import WithdrawalStore
from iris_airflow_provider.services.runners import Runners
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.requeue import RequeueOutcome

log = logging.getLogger(__name__)


@dataclass(eq=False)  # a service, compared by identity
class Withdrawals:
    store: WithdrawalStore
    _: KW_ONLY
    runners: Runners
    clock: Callable[[], int]
    start_timeout_s: float  # the cluster's default; a job may set its own
    staleness_ms: int  # a peer heard from within this is live
    avoid_ms: int
    max_requeues: int

    def withdraw(self) -> list[str]:
        """Begin withdrawing overdue jobs and finish the withdrawals their peers confirm; the ids of
        the jobs back in the queue (or failed, their requeue budget spent)."""
        now = self.clock()
        live = {record.peer_id for record in self.store.peers() if record.is_reachable(now, self.staleness_ms)}
        for job in self.store.not_started_handoffs():
            spec = job.job_spec
            timeout = start_timeout_ms(spec.start_timeout_seconds, self.start_timeout_s)
            overdue = start_overdue(
                state=job.state,
                started=job.started,
                pinned=bool(spec.pin),
                handed_off_at_ms=job.handed_off_at_ms,
                now_ms=now,
                timeout_ms=timeout,
            )
            if overdue and job.peer_id in live:  # an unreachable peer's jobs are the lost-peer rule's
                self.store.begin_withdrawal(job, reasons.not_started(job.peer_id, timeout), now)
        return [job.job_id for job in self.store.withdrawals() if self._finish(job)]

    def _finish(self, job: JobRecord) -> bool:
        peer = self.runners.peer_of(job)
        if peer is None:
            return False  # removed from the configuration: the lost-peer rule settles it
        try:
            where = peer.terminate(job.job_id, job.nonce)
        except PeerError as error:
            log.info("Could not withdraw %s from peer %s yet (will retry): %s", job.job_id, job.peer_id, error)
            return False
        if where is Termination.STOPPING:  # only once it is over there does the job move
            return False
        now = self.clock()
        outcome = self.store.finish_withdrawal(
            job, now_ms=now, avoid_until_ms=now + self.avoid_ms, max_requeues=self.max_requeues
        )
        if outcome is not RequeueOutcome.STALE:
            log.warning("Withdrew %s from peer %s (%s): %s", job.job_id, job.peer_id, outcome, job.withdraw_reason)
        return outcome is not RequeueOutcome.STALE

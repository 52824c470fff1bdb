"""Cancelling jobs: record the intent, tell whoever runs the job, and re-tell it until confirmed.

Before any delivery a job never reaches a peer (the store ends it at once); a local or received
job's backend is told now; a handoff that may have reached its peer, or may still reach it, is
routed there by its incarnation's nonce, and re-driven on every tick until the peer confirms it
killed that incarnation, or that it never had it once no delivery can still bring it there
(:mod:`iris_airflow_provider.core.cancel_settlement`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace

from iris_airflow_provider.core.cancel_settlement import CancelVerdict, after_cancel_answer, never_had_error
from iris_airflow_provider.core.job_tree import orphan_reason, parent_key
from iris_airflow_provider.peers.base import PeerError
from iris_airflow_provider.services.ports import CancelStore
from iris_airflow_provider.services.runners import RUN_HERE, Runners
from iris_airflow_provider.store.records import CancelOutcome, JobRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """What a user's cancel did. ``result``: ``cancelled`` (ended now: it had not reached a peer),
    ``cancel_requested`` (sent to whoever runs it; it ends when they confirm), ``already_finished``
    or ``not_found``; ``job`` as it is after the cancel (None when not found)."""

    job_id: str
    result: str
    message: str
    job: JobRecord | None


@dataclass(eq=False)  # a service, compared by identity
class Cancels:
    store: CancelStore
    _: KW_ONLY
    runners: Runners
    clock: Callable[[], int]
    delivery_timeout_ms: int

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job and its whole tree: before handoff it never reaches a peer; after, the peer
        is told (and re-told); its children (which run here) are told by their backends."""
        outcomes = self.store.request_cancel_tree(job_id, self.clock())
        for child_id, child_outcome in outcomes[1:]:
            self._route(child_id, child_outcome)
        return self._route(job_id, outcomes[0][1])

    def _route(self, job_id: str, outcome: CancelOutcome) -> CancelOutcome:
        # A queued job has no peer to tell (not even its pin): only local jobs and handoffs that
        # may have reached a peer (``notify_peer``) are routed, as the re-drive does.
        routed = outcome.direction in RUN_HERE or bool(outcome.notify_peer)
        if outcome.found and not outcome.was_terminal and routed:
            record = self.store.get_job(job_id)
            if record is not None and self.deliver(record) and outcome.notify_peer:
                ended = self.store.get_job(job_id)
                if ended is not None and ended.terminal:  # the peer never had it: ended here and now
                    return replace(outcome, killed=True)
        return outcome

    def cancel_with_answer(self, job_id: str) -> CancelAnswer:
        """Cancel for a user (the Federation page, the CLI) and say what happened."""
        outcome = self.cancel(job_id)
        job = self.store.get_job(job_id)
        if not outcome.found or job is None:
            return CancelAnswer(job_id, "not_found", f"Job {job_id} not found", None)
        if outcome.was_terminal:
            message = f"Job {job_id} already finished ({job.state.value}); nothing to cancel"
            return CancelAnswer(job_id, "already_finished", message, job)
        if outcome.killed:
            return CancelAnswer(job_id, "cancelled", job.error or "Cancelled", job)
        if outcome.notify_peer:
            message = f"Cancel sent to peer {outcome.notify_peer}; it ends when the peer confirms"
            return CancelAnswer(job_id, "cancel_requested", message, job)
        where = f"local backend {job.backend_id}" if job.backend_id else "its backend"
        return CancelAnswer(
            job_id, "cancel_requested", f"Cancel sent to {where}; it ends when the backend confirms", job
        )

    def deliver(self, record: JobRecord) -> bool:
        """Tell whoever runs ``record`` to stop it; whether the cancel is now confirmed."""
        try:
            if record.direction in RUN_HERE:
                backend = self.runners.backend_of(record)
                found = backend.cancel(record.job_id) if backend is not None else False
            else:
                peer = self.runners.peer_of(record)
                if peer is None:
                    return False  # a peer no longer configured: it counts as lost (services/lost_peers.py)
                found = peer.cancel(record.job_id, record.nonce)  # that incarnation only
        except (PeerError, OSError) as error:
            log.warning("Cancel of %s could not be delivered yet (will retry): %s", record.job_id, error)
            return False
        if record.direction in RUN_HERE:
            if not found:
                self.store.mark_gone(record.job_id, record.nonce, self.clock())
            self.store.confirm_cancel(record.job_id, record.nonce, record.cancel_intent_version, self.clock())
            return True
        now = self.clock()
        verdict = after_cancel_answer(
            found, claimed_at_ms=record.delivery_claimed_at_ms, now_ms=now, delivery_timeout_ms=self.delivery_timeout_ms
        )
        if verdict is CancelVerdict.ASK_AGAIN:
            log.info(
                "Peer %s does not have %s yet, and a delivery of it is in flight: asking again",
                record.peer_id,
                record.job_id,
            )
            return False
        if verdict is CancelVerdict.NEVER_HAD:
            return self.store.cancel_never_had(record, never_had_error(record.handoff_state), now)
        self.store.confirm_cancel(record.job_id, record.nonce, record.cancel_intent_version, now)
        return True

    def kill_orphans(self) -> list[str]:
        """Cancel every live child whose parent has ended, is gone or is being cancelled (a child
        admitted just before its parent ended, or a parent that ended without a cancel); the ids."""
        children = self.store.live_children()
        parents = self.store.get_jobs(parent_key(child.job_id) or "" for child in children)
        killed = []
        for child in sorted(children, key=lambda job: job.job_id):  # parents before their children
            key = parent_key(child.job_id) or ""
            parent = parents.get(key)
            reason = orphan_reason(
                key, parent.state if parent else None, cancel_requested=bool(parent and parent.cancel_requested)
            )
            if reason is None or child.cancel_requested:
                continue
            self.store.record_event(child.job_id, "orphaned", self.clock(), reason)
            log.info("Cancelling %s: %s", child.job_id, reason)
            self.cancel(child.job_id)
            killed.append(child.job_id)
        return killed

    def redrive(self) -> list[str]:
        """Re-send every unconfirmed cancel; the ids of those now confirmed."""
        return [job.job_id for job in self.store.pending_cancels() if self.deliver(job)]

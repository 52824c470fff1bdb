"""Lost peers: when a peer counts as lost, and what becomes of each job handed off there.

A peer unreachable for ``peer_lost_ms`` (or removed from the cluster file: lost at once) may be
gone for good, or only cut off; its jobs are settled by what the parent knows of them:

- a cancel was requested and never confirmed: the job ends killed (the user wanted it stopped);
- a pinned job may run nowhere else: it fails with the reason;
- a job the peer never reported running goes back to the queue under a new incarnation, avoiding
  that peer (as a requeue does);
- a job reported running follows its ``on_peer_lost`` policy: ``fail`` (its state there is
  unknown; a retry runs a new incarnation) or ``requeue`` (a new incarnation elsewhere, for jobs
  that checkpoint).

Whatever is decided, the incarnation left on that peer is terminated there by its nonce if the peer
comes back (the caller records it), so nothing runs twice once it answers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import JobState


class OnPeerLost(StrEnum):
    FAIL = "fail"
    REQUEUE = "requeue"


@dataclass(frozen=True, slots=True)
class LostRequeue:
    reason: str  # why it left the peer (for the history and the requeue budget's message)


@dataclass(frozen=True, slots=True)
class LostEnd:
    state: JobState
    error: str


LostDecision = LostRequeue | LostEnd


def peer_is_lost(unreachable_since_ms: int | None, now_ms: int, peer_lost_ms: int) -> bool:
    """Whether a configured peer, unreachable since ``unreachable_since_ms`` (None: it answers), is lost."""
    return unreachable_since_ms is not None and now_ms - unreachable_since_ms >= peer_lost_ms


def loss_reason(peer_id: str, *, configured: bool, peer_lost_ms: int) -> str:
    """Why the jobs on ``peer_id`` are settled: how long it was lost, or that it was removed."""
    return reasons.peer_lost(peer_id, peer_lost_ms) if configured else reasons.peer_removed(peer_id)


def after_peer_lost(
    reason: str,
    *,
    state: JobState,
    started: bool,
    pinned: bool,
    cancel_requested: bool,
    policy: OnPeerLost,
) -> LostDecision:
    """What becomes of one live job handed off to a lost peer (``reason``: :func:`loss_reason`)."""
    if cancel_requested:
        return LostEnd(JobState.KILLED, reasons.cancel_unconfirmed(reason))
    if pinned:
        return LostEnd(JobState.FAILED, reason)
    ran = started or state is JobState.RUNNING
    if not ran or policy is OnPeerLost.REQUEUE:
        return LostRequeue(reason)
    return LostEnd(JobState.FAILED, reason)

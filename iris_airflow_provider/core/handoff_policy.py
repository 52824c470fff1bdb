"""What a failed delivery leads to: retry the same peer with backoff, requeue, or reject.

The tick carries the decision out; the rule is here. A peer that refused the job for good
(permission, invalid spec, a clash of job ids) rejects it. An unpinned job the peer cannot take
(``hopeless``: it lacks the capacity, or is no longer configured), or one that has failed to be
delivered for ``requeue_after_ms``, goes back to the queue and avoids that peer for ``avoid_ms``.
Anything else is retried on the same peer after an exponential backoff with jitter (peers
recovering are then not hit in lockstep). The jitter is passed in: a draw in [0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DELIVERY_BACKOFF_BASE_MS = 5_000
DELIVERY_BACKOFF_MAX_MS = 300_000
_MAX_DOUBLINGS = 16


class DeliveryError(Enum):
    REFUSED = "refused"  # the peer will never take it: the handoff ends
    CANNOT_TAKE = "cannot_take"  # not on this peer, maybe on another: requeue unless pinned
    TRANSIENT = "transient"  # unreachable, timed out, unknown: retry


@dataclass(frozen=True, slots=True)
class RequeueRules:
    requeue_after_ms: int  # how long delivery may keep failing before an unpinned job is requeued
    avoid_ms: int  # how long a requeued job stays away from the peer it left


@dataclass(frozen=True, slots=True)
class Retry:
    at_ms: int
    delay_ms: int


@dataclass(frozen=True, slots=True)
class Requeue:
    avoid_until_ms: int


@dataclass(frozen=True, slots=True)
class Reject:
    message: str


HandoffDecision = Retry | Requeue | Reject


def delivery_backoff_ms(attempts: int, jitter: float) -> int:
    """The wait before the next attempt after ``attempts`` failed ones: doubling from the base up to
    the maximum, then scaled by ``0.5 + jitter / 2`` (half to all of it)."""
    backoff = min(DELIVERY_BACKOFF_MAX_MS, DELIVERY_BACKOFF_BASE_MS * 2 ** min(attempts, _MAX_DOUBLINGS))
    return int(backoff * (0.5 + jitter / 2))


def after_delivery_error(
    error: DeliveryError,
    message: str,
    *,
    pinned: bool,
    failing_since_ms: int | None,
    attempts: int,
    now_ms: int,
    jitter: float,
    rules: RequeueRules,
) -> HandoffDecision:
    """The decision for one handoff whose delivery just failed with ``error``."""
    if error is DeliveryError.REFUSED:
        return Reject(message)
    failing_for = now_ms - (failing_since_ms or now_ms)
    if not pinned and (error is DeliveryError.CANNOT_TAKE or failing_for >= rules.requeue_after_ms):
        return Requeue(now_ms + rules.avoid_ms)
    delay = delivery_backoff_ms(attempts, jitter)
    return Retry(now_ms + delay, delay)

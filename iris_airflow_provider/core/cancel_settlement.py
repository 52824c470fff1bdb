"""When a cancel of a handoff is settled: a peer's "I do not have it" counts only once the delivery has.

A cancel may land while the job is being delivered. The peer then answers "not found" (the job has
not arrived), and the delivery lands after: trusting that answer would leave the job running there
while the parent calls it cancelled. So a delivery in flight is recorded (a claim, started when the
call starts and cleared when its outcome is recorded), and a peer's "not found" settles a cancel
only when no delivery of that incarnation was in flight when the cancel was sent. A claim whose
tick died with it counts as settled once the delivery timeout (and a margin) has passed: by then
the call has timed out, whatever became of it.

A cancel that finds the job killed there (or finished) is confirmed whatever the delivery does; a
cancel before any delivery was attempted ends the job at once, as the seed's "Cancelled before
handoff" (nothing ever reached a peer).
"""

from __future__ import annotations

from enum import Enum

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState

DELIVERY_CLAIM_MARGIN_MS = 60_000


class CancelVerdict(Enum):
    CONFIRMED = "confirmed"  # the peer killed that incarnation (or it had already ended there)
    NEVER_HAD = "never_had"  # the peer does not have it, and no delivery can still bring it there
    ASK_AGAIN = "ask_again"  # "not found" while a delivery may still land: ask again later


def claim_stale_before(now_ms: int, delivery_timeout_ms: int) -> int:
    """Claims started before this time are no longer in flight (their call has timed out)."""
    return now_ms - delivery_timeout_ms - DELIVERY_CLAIM_MARGIN_MS


def delivery_in_flight(claimed_at_ms: int | None, now_ms: int, delivery_timeout_ms: int) -> bool:
    """Whether a delivery of the incarnation may still be on its way to the peer."""
    return claimed_at_ms is not None and claimed_at_ms > claim_stale_before(now_ms, delivery_timeout_ms)


def after_cancel_answer(
    found: bool, *, claimed_at_ms: int | None, now_ms: int, delivery_timeout_ms: int
) -> CancelVerdict:
    """What the peer's answer to a cancel of one incarnation settles; ``claimed_at_ms``: the delivery
    claim as it stood before the cancel was sent."""
    if found:
        return CancelVerdict.CONFIRMED
    if delivery_in_flight(claimed_at_ms, now_ms, delivery_timeout_ms):
        return CancelVerdict.ASK_AGAIN
    return CancelVerdict.NEVER_HAD


def never_had_error(handoff_state: HandoffState | None) -> str:
    """How a cancelled job the peer never had (or no longer has) ends: before the peer admitted it,
    it never reached the peer; after, the peer lost it."""
    if handoff_state in (HandoffState.QUEUED, HandoffState.PENDING):
        return reasons.CANCELLED_BEFORE_HANDOFF
    return reasons.CANCELLED_PEER_GONE


def ends_at_once(handoff_state: HandoffState | None, *, claimed_at_ms: int | None, delivery_attempts: int) -> bool:
    """Whether a cancel ends a sent job at once: queued, or promoted but never sent (no delivery was
    ever started: none in flight, none failed)."""
    if handoff_state is HandoffState.QUEUED:
        return True
    return handoff_state is HandoffState.PENDING and claimed_at_ms is None and delivery_attempts == 0


def killed_error(*, sent: bool, cancel_requested: bool, peer_id: str, reported_error: str) -> str:
    """The error of a job its runner reports killed: a cancel this cluster asked of a peer says where
    it was carried out; anything else keeps the runner's words."""
    if sent and cancel_requested:
        return reasons.cancelled_on_peer(peer_id)
    return reported_error

"""The exact user-facing strings of the seed: pending reasons and terminal errors.

Operators' runbooks match on these, so they are part of the product and never reworded.
"""

from __future__ import annotations

QUEUED_UNPINNED = "Queued for a federation peer to report free capacity"
CANCELLED_BEFORE_HANDOFF = "Cancelled before handoff"
CANCELLED_PEER_GONE = "Cancelled (peer reported the job gone)"
CANCELLED = "Cancelled"
SCHEDULING_TIMEOUT = "Scheduling timeout exceeded while queued for a federation peer"


def queued(pinned_peer_id: str) -> str:
    """In the queue: no peer chosen yet, or pinned to one (``target_cluster``)."""
    if pinned_peer_id:
        return f"Queued for peer {pinned_peer_id} to report free capacity"
    return QUEUED_UNPINNED


def awaiting_acceptance(peer_id: str) -> str:
    """Promoted and being delivered; the peer has not admitted it yet."""
    return f"Awaiting acceptance by peer {peer_id}"


def awaiting_first_report(peer_id: str) -> str:
    """Admitted by the peer; its first status report has not landed."""
    return f"Handed off to peer {peer_id}; awaiting first status report"


def pending_on_peer(peer_id: str) -> str:
    """Reported by the peer and still pending there."""
    return f"Pending on peer {peer_id}"


def peer_rejected(peer_id: str, message: str) -> str:
    return f"Peer {peer_id} rejected the handoff: {message}"


def requeues_exhausted(requeues: int, peer_id: str, message: str) -> str:
    """Beyond the seed: the job went back to the queue ``requeues`` times and the last peer failed too."""
    return f"No federation peer could take the job after {requeues} requeue(s); peer {peer_id}: {message}"

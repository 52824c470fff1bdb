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


def cancelled_on_peer(peer_id: str) -> str:
    """Beyond the seed: a cancel the peer carried out (it killed the job there)."""
    return f"Cancelled on peer {peer_id}"


def duration(ms: int) -> str:
    """A setting's length as people say it: whole minutes as ``15 min``, anything else in seconds."""
    if ms >= 60_000 and ms % 60_000 == 0:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:g} s"


def peer_lost(peer_id: str, lost_ms: int) -> str:
    """A peer unreachable for ``placement.peer_lost_seconds``: what is known of a job handed off there."""
    return f"Peer {peer_id} lost for {duration(lost_ms)}; the job's state there is unknown"


def peer_removed(peer_id: str) -> str:
    """A peer no longer in the cluster file: lost at once."""
    return f"Peer {peer_id} was removed from the cluster file; the job's state there is unknown"


def pinned_peer_removed(peer_id: str) -> str:
    """A queued job pinned to a peer that is no longer configured: it can never be placed."""
    return f"Pinned to peer {peer_id}, which was removed from the cluster file"


def cancel_unconfirmed(reason: str) -> str:
    """A cancel its peer never confirmed before the peer was lost (``reason``): the job ends anyway."""
    return f"Cancelled without the peer's confirmation: {reason}"


def not_started(peer_id: str, timeout_ms: int) -> str:
    """Beyond the seed: a job its peer accepted but did not start within the start timeout."""
    return f"peer {peer_id} did not start the job within {duration(timeout_ms)}"

"""Job and handoff states, and the pending reason they imply.

The handoff state and the job state are separate axes (as in the reference): the handoff state
says where a job this cluster sent stands with its peer, the job state says how the job itself is
doing, wherever it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from iris_airflow_provider.core import reasons


class Direction(StrEnum):
    LOCAL = "local"  # runs on this cluster's own backend
    SENT = "sent"  # this cluster is the parent; the job runs (or will run) on a peer
    RECEIVED = "received"  # a peer handed this job to us


class HandoffState(StrEnum):
    QUEUED = "queued"  # waiting for a peer to report free capacity
    PENDING = "pending"  # promoted to a peer; being delivered
    HANDED_OFF = "handed_off"  # the peer admitted it
    REJECTED = "rejected"  # the peer refused it for good


class JobState(StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"  # admitted where it runs (e.g. by Kueue), not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    UNSCHEDULABLE = "unschedulable"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.UNSCHEDULABLE})


class JobStateView(Protocol):
    """What a job's pending reason depends on: a stored record, a waiting task's snapshot, or a
    state replayed from the job's history."""

    @property
    def direction(self) -> Direction: ...
    @property
    def handoff_state(self) -> HandoffState | None: ...
    @property
    def state(self) -> JobState: ...
    @property
    def peer_id(self) -> str: ...
    @property
    def backend_id(self) -> str: ...
    @property
    def reported(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SeenState:
    """A job's state at one point of its history (see ``pending_reason_history``)."""

    direction: Direction
    handoff_state: HandoffState | None
    state: JobState
    peer_id: str
    backend_id: str
    reported: bool


def pending_reason(job: JobStateView) -> str:
    """What a non-terminal job waits for, in the seed's exact words where the seed has them."""
    if job.state.terminal:
        return ""
    if job.direction is Direction.SENT:
        if job.handoff_state is HandoffState.QUEUED:
            return reasons.queued(job.peer_id)
        if job.reported:
            return reasons.pending_on_peer(job.peer_id) if job.state is not JobState.RUNNING else ""
        if job.handoff_state is HandoffState.PENDING:
            return reasons.awaiting_acceptance(job.peer_id)
        return reasons.awaiting_first_report(job.peer_id)
    if job.state in (JobState.PENDING, JobState.ACCEPTED):
        return f"Pending on local backend {job.backend_id}" if job.backend_id else "Pending"
    return ""

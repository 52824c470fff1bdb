"""Rows of the federation store as immutable records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from iris_airflow_provider.federation.model import JobSpec
from iris_airflow_provider.federation.states import Direction, HandoffState, JobState, pending_reason


@dataclass(frozen=True, slots=True)
class Origin:
    """The Airflow task instance that submitted a job."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    direction: Direction
    handoff_state: HandoffState | None
    state: JobState
    peer_id: str
    backend_id: str
    owner_principal: str
    submitting_user: str
    nonce: str
    cancel_intent_version: int
    priority_band: str
    submitted_at_ms: int
    scheduling_deadline_ms: int | None
    spec: Mapping[str, Any]
    error: str
    exit_code: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    reported_at_ms: int | None
    updated_at_ms: int
    row_version: int
    origin: Origin | None
    delivery_attempts: int = 0
    next_delivery_at_ms: int | None = None
    last_delivery_error: str = ""
    cancel_delivered_version: int = 0
    log_cursor: str = ""
    last_log_seq: int = 0
    handoff_since_ms: int | None = None
    requeue_count: int = 0
    avoided_peers: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobRecord:
        origin = None
        if row["origin_dag_id"] is not None:
            origin = Origin(row["origin_dag_id"], row["origin_run_id"], row["origin_task_id"], row["origin_map_index"])
        return cls(
            job_id=row["job_id"],
            direction=Direction(row["direction"]),
            handoff_state=HandoffState(row["handoff_state"]) if row["handoff_state"] else None,
            state=JobState(row["state"]),
            peer_id=row["peer_id"],
            backend_id=row["backend_id"],
            owner_principal=row["owner_principal"],
            submitting_user=row["submitting_user"],
            nonce=row["nonce"],
            cancel_intent_version=row["cancel_intent_version"],
            priority_band=row["priority_band"],
            submitted_at_ms=row["submitted_at_ms"],
            scheduling_deadline_ms=row["scheduling_deadline_ms"],
            spec=row["spec"],
            error=row["error"],
            exit_code=row["exit_code"],
            started_at_ms=row["started_at_ms"],
            finished_at_ms=row["finished_at_ms"],
            reported_at_ms=row["reported_at_ms"],
            updated_at_ms=row["updated_at_ms"],
            row_version=row["row_version"],
            origin=origin,
            delivery_attempts=row["delivery_attempts"],
            next_delivery_at_ms=row["next_delivery_at_ms"],
            last_delivery_error=row["last_delivery_error"],
            cancel_delivered_version=row["cancel_delivered_version"],
            log_cursor=row["log_cursor"],
            last_log_seq=row["last_log_seq"],
            handoff_since_ms=row["handoff_since_ms"],
            requeue_count=row["requeue_count"],
            avoided_peers=row["avoided_peers"] or {},
        )

    @property
    def job_spec(self) -> JobSpec:
        return JobSpec.model_validate(self.spec)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def avoided_peer_ids(self, now_ms: int) -> list[str]:
        """The peers this job must not be placed on at ``now_ms``."""
        return sorted(peer for peer, until in self.avoided_peers.items() if until > now_ms)

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_intent_version > 0

    @property
    def pending_reason(self) -> str:
        return pending_reason(
            direction=self.direction,
            handoff_state=self.handoff_state,
            state=self.state,
            peer_id=self.peer_id,
            backend_id=self.backend_id,
            reported=self.reported_at_ms is not None,
        )


@dataclass(frozen=True, slots=True)
class JobEvent:
    seq: int
    job_id: str
    at_ms: int
    kind: str
    state: str | None
    handoff_state: str | None
    peer_id: str
    detail: str


def pending_reason_history(direction: Direction, events: list[JobEvent]) -> list[str]:
    """Every pending reason a job went through, in order, replayed from its history events."""
    state, handoff, peer_id, backend_id, reported = JobState.PENDING, None, "", "", False
    history: list[str] = []
    for event in events:
        if event.kind in ("admitted", "resubmitted"):
            state, reported = JobState.PENDING, False
            handoff = HandoffState(event.handoff_state) if event.handoff_state else None
        elif event.kind == "requeued":  # back in the queue, no peer chosen; its peer_id is the one it left
            handoff, peer_id = HandoffState.QUEUED, ""
        elif event.kind in ("promoted", "handed_off", "rejected") and event.handoff_state:
            handoff = HandoffState(event.handoff_state)
        elif event.kind in ("reported", "state", "expired") and event.state:
            state = JobState(event.state)
            if event.kind == "reported":
                reported = True
                handoff = HandoffState.HANDED_OFF if handoff is HandoffState.PENDING else handoff
        if event.kind not in ("requeued", "stray_terminated"):  # those name a peer the job has left
            peer_id = event.peer_id or peer_id
        reason = pending_reason(
            direction=direction,
            handoff_state=handoff,
            state=state,
            peer_id=peer_id,
            backend_id=backend_id,
            reported=reported,
        )
        if reason and (not history or history[-1] != reason):
            history.append(reason)
    return history


@dataclass(frozen=True, slots=True)
class PeerRecord:
    peer_id: str
    reachable: bool
    last_contact_ms: int | None
    last_attempt_ms: int | None
    last_error: str
    backends: tuple[BackendRecord, ...]

    def is_reachable(self, now_ms: int, staleness_ms: int) -> bool:
        """As placement sees it (``PeerState.is_reachable``): answered, and recently enough."""
        return self.reachable and self.last_contact_ms is not None and now_ms - self.last_contact_ms <= staleness_ms


@dataclass(frozen=True, slots=True)
class BackendRecord:
    backend_id: str
    kind: str
    attributes: Mapping[str, list[Any]]
    availability: Mapping[str, Any] | None
    observation_epoch_ms: int | None
    received_at_ms: int


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel did. ``notify_peer``: the peer to route a cancel to ("" when none)."""

    found: bool
    was_terminal: bool = False
    killed: bool = False
    direction: Direction | None = None
    notify_peer: str = ""

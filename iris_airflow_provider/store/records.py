"""Rows of the federation store as immutable records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from iris_airflow_provider.core.job_report import JobReport, ReplicaReport, projected
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.ownership import Owner
from iris_airflow_provider.core.states import Direction, HandoffState, JobState, SeenState, pending_reason


@dataclass(frozen=True, slots=True)
class Origin:
    """The Airflow task instance that submitted a job."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1


@dataclass(frozen=True, slots=True)
class NewIncarnation:
    """A job to admit, or to run again under its id (a rerun of a finished one): what its new
    incarnation starts from. The nonce is fresh unless given (a peer keeps the parent's)."""

    spec: JobSpec
    direction: Direction
    submitting_user: str
    owner_principal: str = ""
    peer_id: str = ""
    backend_id: str = ""
    nonce: str | None = None
    origin: Origin | None = None
    key: str = ""  # where the store keeps it, when not under its spec's id (a received job's namespaced key)

    @property
    def job_id(self) -> str:
        return self.key or self.spec.job_id

    @property
    def owner(self) -> Owner:
        return owner_of(self.origin, self.submitting_user)


def owner_of(origin: Origin | None, submitting_user: str) -> Owner:
    """What owns a job submitted from ``origin`` by ``submitting_user`` (no origin: a job submitted
    outside a task, owned by its user alone)."""
    return Owner(origin.dag_id if origin else "", origin.task_id if origin else "", submitting_user)


ORIGIN_PARTS = ("dag_id", "run_id", "task_id", "map_index")  # columns origin_<part>

# Columns whose stored form is not what records hold; every other column is taken as it is.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "direction": Direction,
    "state": JobState,
    "handoff_state": lambda value: HandoffState(value) if value else None,
    "avoided_peers": lambda value: value or {},
    "children": lambda value: tuple(value or ()),
    "replicas": lambda value: tuple(
        ReplicaReport(r["index"], JobState(r["state"]), r.get("exit_code")) for r in value or ()
    ),
}


def replica_values(replicas: tuple[ReplicaReport, ...]) -> list[dict[str, Any]]:
    """Replicas as the ``replicas`` column holds them."""
    return [{"index": r.index, "state": r.state.value, "exit_code": r.exit_code} for r in replicas]


def job_values(row: Mapping[Any, Any]) -> dict[str, Any]:
    """Columns of an ``iris_jobs`` row (all, or a selection) as records hold them: enums parsed."""
    return {name: _DECODE[name](value) if name in _DECODE else value for name, value in row.items()}


def avoided_until(avoided_peers: Mapping[str, int], now_ms: int) -> list[str]:
    """The peers of ``avoided_peers`` (peer -> until when, ms) still avoided at ``now_ms``."""
    return sorted(peer for peer, until in avoided_peers.items() if until > now_ms)


class QueuedJob(NamedTuple):
    """A queued job as the tick reads it: the columns placement needs, not the spec (a named tuple:
    one is made per queued job on every tick)."""

    job_id: str
    priority_band: str
    submitted_at_ms: int
    scheduling_deadline_ms: int | None
    placement: str | None  # core/placement_projection.py; None for rows from before it existed
    avoided_peers: Mapping[str, int] | None  # None: never requeued, so it avoids no peer
    spec: Mapping[str, Any] | None  # only when ``placement`` is None

    def avoided_peer_ids(self, now_ms: int) -> list[str]:
        """The peers this job must not be placed on at ``now_ms``."""
        return avoided_until(self.avoided_peers or {}, now_ms)


# Not slotted: ``job_spec`` caches its parse in the instance's ``__dict__``.
@dataclass(frozen=True)
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
    replicas: tuple[ReplicaReport, ...] = ()  # as its runner last reported them
    holding_since_ms: int | None = None  # when a report first said it holds capacity where it runs
    delivery_claimed_at_ms: int | None = None
    handed_off_at_ms: int | None = None
    withdraw_reason: str = ""
    placement: str | None = None  # what placement reads of the spec (core/placement_projection.py)
    # A handed-off root's children as its peer last reported them (store/trees.py): JSON objects.
    children: tuple[Mapping[str, Any], ...] = ()
    # A handed-off job's serving URLs as its peer minted them for this incarnation, once checked
    # (store/reports.py); None until the peer reports any, and once the job ends.
    serving_urls: Mapping[str, str] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobRecord:
        """A whole ``iris_jobs`` row (``SELECT *`` or ``RETURNING *``)."""
        values = job_values(row)
        dag_id, run_id, task_id, map_index = (values.pop(f"origin_{part}") for part in ORIGIN_PARTS)
        origin = Origin(dag_id, run_id, task_id, map_index) if dag_id is not None else None
        return cls(**values, origin=origin)

    @cached_property
    def job_spec(self) -> JobSpec:
        """The spec, validated once per record (a record is immutable; re-validating is what made a tick slow)."""
        return JobSpec.model_validate(self.spec)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def owner(self) -> Owner:
        return owner_of(self.origin, self.submitting_user)

    def report(self, replicas: tuple[ReplicaReport, ...] | None = None) -> JobReport:
        """Where this incarnation stands, as the one job-state value (replicas as last reported,
        unless fresher ones from its backend are given)."""
        return projected(self, JobReport) if replicas is None else projected(self, JobReport, replicas=replicas)

    @property
    def failed_replicas(self) -> str:
        """The replicas that failed, for a failure message: ``replica 2 (exit code 7)``; "" when none known."""
        failed = [r for r in self.replicas if r.state is JobState.FAILED]
        return ", ".join(
            f"replica {r.index}" + (f" (exit code {r.exit_code})" if r.exit_code is not None else "") for r in failed
        )

    def avoided_peer_ids(self, now_ms: int) -> list[str]:
        """The peers this job must not be placed on at ``now_ms``."""
        return avoided_until(self.avoided_peers, now_ms)

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_intent_version > 0

    @property
    def reported(self) -> bool:
        """Whether its runner (a peer, or a local backend) has reported on it yet."""
        return self.reported_at_ms is not None

    @property
    def started(self) -> bool:
        """Whether its runner ever reported it running."""
        return self.started_at_ms is not None or self.state is JobState.RUNNING

    @property
    def pending_reason(self) -> str:
        return pending_reason(self)


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


INCARNATION_STARTS = ("admitted", "resubmitted")


def current_incarnation(events: list[JobEvent]) -> list[JobEvent]:
    """The history of the job's latest incarnation: from its last admission or rerun on. What an
    earlier run did is not the concern of whoever looks at this one."""
    starts = [index for index, event in enumerate(events) if event.kind in INCARNATION_STARTS]
    return events[starts[-1] :] if starts else events


def pending_reason_history(direction: Direction, events: list[JobEvent]) -> list[str]:
    """Every pending reason a job went through, in order, replayed from its history events."""
    state, handoff, peer_id, backend_id, reported = JobState.PENDING, None, "", "", False
    history: list[str] = []
    for event in events:
        if event.kind in INCARNATION_STARTS:
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
        reason = pending_reason(SeenState(direction, handoff, state, peer_id, backend_id, reported))
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
    unreachable_since_ms: int | None = None  # None: it answered the last heartbeat
    observed_after_ms: int | None = None  # when the heartbeat whose backends these are was asked for

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
class Admitted:
    """Peer ``peer_id`` admitted incarnation ``nonce`` of ``job_id`` (a delivery's outcome)."""

    job_id: str
    nonce: str
    peer_id: str = ""


@dataclass(frozen=True, slots=True)
class HandoffRefusal:
    """A peer could not take the incarnation ``nonce`` of ``job_id``: why, and until when to avoid it."""

    job_id: str
    nonce: str
    peer_id: str
    reason: str
    avoid_until_ms: int


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel did. ``notify_peer``: the peer to route a cancel to ("" when none)."""

    found: bool
    was_terminal: bool = False
    killed: bool = False
    direction: Direction | None = None
    notify_peer: str = ""

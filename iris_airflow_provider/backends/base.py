"""What every backend offers: capacity in the seed's shape, idempotent submission, status, cancel, logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from iris_airflow_provider.federation.availability import PeerBackend
from iris_airflow_provider.federation.model import JobSpec
from iris_airflow_provider.federation.states import JobState


class AlreadyExistsError(Exception):
    """A different incarnation of this job is still running here."""


class SubmissionRefusedError(Exception):
    """The backend can never run this job (e.g. a device it does not have); the message says why."""


class InsufficientCapacityError(SubmissionRefusedError):
    """The backend has the job's kind of device, but never enough of it: another cluster might."""


@dataclass(frozen=True, slots=True)
class Submission:
    job_id: str
    nonce: str  # the incarnation: the same nonce again is a replay, a new one a new run
    spec: JobSpec
    requester: str  # the cluster that asked ("" for this cluster's own jobs)
    submitted_at_ms: int


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    index: int
    state: JobState
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class JobReport:
    job_id: str
    nonce: str
    state: JobState
    backend_id: str
    error: str = ""
    exit_code: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    replicas: tuple[ReplicaReport, ...] = ()


@dataclass(frozen=True, slots=True)
class LogChunk:
    """New log lines since ``cursor``; pass ``next_cursor`` next time to get only what follows."""

    lines: tuple[str, ...]
    next_cursor: str
    truncated: bool = False  # more was available than the bound allowed


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    report: JobReport
    replay: bool = False  # the same incarnation was already here


class Backend(Protocol):
    backend_id: str
    kind: str

    def describe(self) -> PeerBackend:
        """Advertised attributes and current availability, as a heartbeat reports them."""
        ...

    def submit(self, submission: Submission) -> SubmitOutcome:
        """Start (or queue) a job; idempotent by nonce. Raises AlreadyExistsError or SubmissionRefusedError."""
        ...

    def status(self, job_id: str) -> JobReport | None:
        """The job's current state, or None when this backend does not have it."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Stop the job (a no-op when it already finished). False when the backend does not have it."""
        ...

    def logs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk: ...

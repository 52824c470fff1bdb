"""The peer protocol (heartbeat, deliver, sync, cancel, logs) and how its failures are classified."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from iris_airflow_provider.backends.base import JobReport, LogChunk
from iris_airflow_provider.core.availability import PeerBackend
from iris_airflow_provider.core.model import JobSpec


class PeerErrorCode(StrEnum):
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    INVALID_ARGUMENT = "invalid_argument"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    NOT_FOUND = "not_found"
    UNAUTHENTICATED = "unauthenticated"
    UNAVAILABLE = "unavailable"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"  # a handoff whose workdir bundle is not uploaded yet
    UNKNOWN = "unknown"


# Answers that will never change on a retry: the handoff ends, the job is killed with the peer's
# message. Everything else (unavailable, unauthenticated: keys and clocks can be fixed; unknown)
# is retried with backoff.
TERMINAL_HANDOFF_CODES = frozenset(
    {
        PeerErrorCode.ALREADY_EXISTS,
        PeerErrorCode.PERMISSION_DENIED,
        PeerErrorCode.INVALID_ARGUMENT,
        PeerErrorCode.PAYLOAD_TOO_LARGE,
    }
)
# Answers that say "not here, but maybe elsewhere": the job goes back to the queue and avoids this
# peer for a while (the reference kills it, or retries the same peer forever).
REQUEUE_HANDOFF_CODES = frozenset({PeerErrorCode.RESOURCE_EXHAUSTED})


class PeerError(Exception):
    def __init__(self, code: PeerErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def terminal(self) -> bool:
        return self.code in TERMINAL_HANDOFF_CODES

    @property
    def requeues(self) -> bool:
        return self.code in REQUEUE_HANDOFF_CODES

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


class Termination(StrEnum):
    """Where an incarnation a peer was told to terminate stands."""

    NOT_FOUND = "not_found"  # the peer does not have that incarnation (never had it, or replaced it)
    STOPPING = "stopping"  # told to stop, not over yet: ask again
    ENDED = "ended"  # over there: stopped now or earlier, or finished on its own


@dataclass(frozen=True, slots=True)
class Handoff:
    """A whole root job, as delivered: the peer runs it under the same id."""

    job_id: str
    nonce: str
    spec: JobSpec
    backend_id: str  # the backend placement chose; "" when force-routed
    requester: str  # this cluster's name
    owner_principal: str
    submitting_user: str
    submitted_at_ms: int


@dataclass(frozen=True, slots=True)
class SyncResult:
    reports: dict[str, JobReport]
    gone: frozenset[str] = field(default_factory=frozenset)  # jobs the peer no longer has
    cursor: str = ""


class Peer(Protocol):
    peer_id: str
    kind: str  # the cluster file's peer kind: "airflow" or "agentless"
    address: str  # where the peer is reached ("" for an agentless peer driven from here)

    def heartbeat(self) -> list[PeerBackend]:
        """The peer's backends with their availability. Raises PeerError when it cannot be reached."""
        ...

    def deliver(self, handoff: Handoff) -> JobReport:
        """Admit the job (idempotent by nonce). Raises PeerError; ``terminal`` ones end the handoff."""
        ...

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        """What the peer reports on the jobs this cluster handed it."""
        ...

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        """Stop the job there (only incarnation ``nonce`` when given); False when the peer does not
        have it. Raises PeerError to be retried."""
        ...

    def terminate(self, job_id: str, nonce: str) -> Termination:
        """Stop incarnation ``nonce`` there and say whether it is over (asking again is harmless).
        Raises PeerError to be retried."""
        ...

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk: ...

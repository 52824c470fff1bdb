"""The peer HTTP API's request and response bodies (``/iris/federation/v1``), shared by both ends."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from iris_airflow_provider.backends.base import JobReport, ReplicaReport
from iris_airflow_provider.federation.states import JobState
from iris_airflow_provider.peers.base import PeerErrorCode

API_PREFIX = "/iris/federation/v1"

# HTTP status for each error code, both ways.
STATUS_OF = {
    PeerErrorCode.INVALID_ARGUMENT: 400,
    PeerErrorCode.UNAUTHENTICATED: 401,
    PeerErrorCode.PERMISSION_DENIED: 403,
    PeerErrorCode.NOT_FOUND: 404,
    PeerErrorCode.ALREADY_EXISTS: 409,
    PeerErrorCode.RESOURCE_EXHAUSTED: 429,
    PeerErrorCode.UNKNOWN: 500,
    PeerErrorCode.UNAVAILABLE: 503,
}


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # newer peers may add fields; older ones ignore them


class ErrorBody(Body):
    code: PeerErrorCode
    message: str


class BackendsResponse(Body):
    cluster: str
    backends: list[dict[str, Any]]  # BackendSummary wire form (federation/wire.py)


class HandoffRequest(Body):
    job_id: str
    nonce: str = Field(min_length=1)
    requester: str
    owner_principal: str = ""
    submitting_user: str = ""
    submitted_at_ms: int = 0
    backend_id: str = ""
    spec: dict[str, Any]


class ReplicaStatus(Body):
    index: int
    state: JobState
    exit_code: int | None = None


class JobStatus(Body):
    job_id: str
    nonce: str
    state: JobState
    backend_id: str = ""
    error: str = ""
    exit_code: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    replicas: list[ReplicaStatus] = Field(default_factory=list)
    tombstone: bool = False

    def to_report(self) -> JobReport:
        return JobReport(
            job_id=self.job_id,
            nonce=self.nonce,
            state=self.state,
            backend_id=self.backend_id,
            error=self.error,
            exit_code=self.exit_code,
            started_at_ms=self.started_at_ms,
            finished_at_ms=self.finished_at_ms,
            replicas=tuple(ReplicaReport(r.index, r.state, r.exit_code) for r in self.replicas),
        )


class HandoffResponse(Body):
    job: JobStatus
    replay: bool = False


class SyncRequest(Body):
    cursor: str = ""


class SyncResponse(Body):
    deltas: list[JobStatus]
    next_cursor: str
    cursor_stale: bool = False


class TerminateRequest(Body):
    job_id: str
    nonce: str = ""  # only this incarnation, when given (a stray one left behind by a requeue)


class LogsResponse(Body):
    lines: list[str]
    next_cursor: str
    truncated: bool = False

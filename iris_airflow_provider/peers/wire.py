"""The peer HTTP API's request and response bodies (``/iris/federation/v1``), shared by both ends."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from iris_airflow_provider.backends.base import JobReport, ReplicaReport
from iris_airflow_provider.core.job_report import projected
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.base import Handoff, PeerErrorCode

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

    @classmethod
    def of(cls, handoff: Handoff) -> HandoffRequest:
        # The whole job travels inline (command, env, files): the peer cannot read our store.
        fields = {name: getattr(handoff, name) for name in cls.model_fields if name != "spec"}
        return cls(**fields, spec=handoff.spec.model_dump(mode="json", exclude=set(handoff.spec.parent_only)))


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

    @classmethod
    def of(cls, report: JobReport) -> JobStatus:
        return cls.model_validate(report, from_attributes=True)

    def to_report(self) -> JobReport:
        return projected(self, JobReport, replicas=tuple(projected(r, ReplicaReport) for r in self.replicas))


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

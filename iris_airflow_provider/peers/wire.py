"""The peer HTTP API's request and response bodies (``/iris/federation/v1``), shared by both ends,
and the limits of each: how large a request the peer reads, and how large an answer the parent reads.

Every text field a request carries is bounded and free of control characters (they would reach the
store, which cannot hold a NUL); a cursor is what this API minted, or a 400.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.backends.base import JobReport, ReplicaReport
from iris_airflow_provider.core.job_ids import JobId
from iris_airflow_provider.core.job_report import ChildReport, projected
from iris_airflow_provider.core.job_result import MAX_RESULT_BYTES, ResultError, parse_result
from iris_airflow_provider.core.limits import MAX_FILES_BYTES
from iris_airflow_provider.core.serving import MAX_PORTS, MAX_SERVING_URL_CHARS, PORT_NAME_PATTERN
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.base import Handoff, PeerErrorCode

API_PREFIX = "/iris/federation/v1"

KiB = 2**10
MiB = 2**20

# Request bodies, by route: the peer refuses a larger one (413) before reading it. A handoff carries
# the job's workdir files inline: their limit at JSON's worst-case escaping (a control character in
# a text file is six bytes, \u0001), plus room for the rest of the job (command, env, constraints).
HANDOFF_BODY_LIMIT = 6 * MAX_FILES_BYTES + 4 * MiB
SMALL_BODY_LIMIT = 64 * KiB  # /sync and /terminate: a cursor, a job id and a nonce
BODY_LIMITS = {"/handoffs": HANDOFF_BODY_LIMIT, "/sync": SMALL_BODY_LIMIT, "/terminate": SMALL_BODY_LIMIT}
# A bundle chunk (PUT /bundles/{digest}) is bounded by the receiving cluster's bundles.chunk_bytes.

# Answers, by route: the parent stops reading a larger one and refuses it.
MAX_BACKENDS = 256  # per heartbeat
MAX_SYNC_DELTAS = 100_000  # per sync answer (a peer sends at most 10,000 changes, or a full snapshot)
MAX_LOG_LINES = 5_000  # per logs call, the most a parent may ask for
MAX_LOG_LINE_CHARS = 8 * KiB  # longer lines are cut by the peer, so an answer is bounded by the lines asked
# Job results a sync answer carries at most (each up to 1 MiB): the peer ends an answer early
# rather than pass it, and the parent asks again from there.
SYNC_RESULTS_BUDGET = 32 * MiB
ANSWER_LIMITS = {
    "/backends": 4 * MiB,
    "/handoffs": 1 * MiB,
    "/sync": 64 * MiB,
    "/terminate": 1 * MiB,
    "/openapi.json": 4 * MiB,
    "/bundles": 64 * KiB,
}


def logs_answer_limit(max_lines: int) -> int:
    """The largest honest answer to a logs call for ``max_lines`` lines: each line at its cut length
    and JSON's worst-case escaping, plus the cursor."""
    return 64 * KiB + max_lines * (6 * MAX_LOG_LINE_CHARS + 16)


# Text from outside: printable (no C0/C1 control characters, which the store cannot always hold).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(value: Any) -> Any:
    if isinstance(value, str) and _CONTROL.search(value):
        raise PydanticCustomError("control_character", "must not contain control characters (such as NUL)")
    return value


def _sync_cursor(value: str) -> str:
    if value and not (value.isascii() and value.isdigit()):
        raise PydanticCustomError("sync_cursor", "must be empty or a cursor this peer returned (an event number)")
    return value


def nul_path(document: Any, path: str = "") -> str | None:
    """Where a parsed JSON document holds a NUL character (in a key or a string), or None. The store
    cannot keep one (PostgreSQL's text and jsonb refuse it), so no answer or request may carry it."""
    stack: list[tuple[str, Any]] = [(path, document)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return where
        elif isinstance(node, dict):
            for key, value in node.items():
                if "\x00" in str(key):
                    return where
                stack.append((f"{where}.{key}" if where else str(key), value))
        elif isinstance(node, list):
            stack.extend((f"{where}[{index}]", value) for index, value in enumerate(node))
    return None


Printable = AfterValidator(_printable)
Name = Annotated[str, Field(max_length=253), Printable]  # cluster and backend ids
Principal = Annotated[str, Field(max_length=320), Printable]  # users (e-mail addresses at most)
JobIdText = Annotated[str, Field(min_length=1, max_length=1024), Printable]  # the job model checks the rest
Nonce = Annotated[str, Field(max_length=128), Printable]
RequiredNonce = Annotated[str, Field(min_length=1, max_length=128), Printable]
SyncCursor = Annotated[str, Field(max_length=19), AfterValidator(_sync_cursor)]
LogCursor = Annotated[str, Field(max_length=64 * KiB), Printable]  # its backend checks the rest
PortName = Annotated[str, Field(pattern=f"^{PORT_NAME_PATTERN.pattern}$")]
ServingUrl = Annotated[str, Field(max_length=MAX_SERVING_URL_CHARS), Printable]  # the parent checks the rest


# HTTP status for each error code, both ways.
STATUS_OF = {
    PeerErrorCode.INVALID_ARGUMENT: 400,
    PeerErrorCode.UNAUTHENTICATED: 401,
    PeerErrorCode.PERMISSION_DENIED: 403,
    PeerErrorCode.NOT_FOUND: 404,
    PeerErrorCode.ALREADY_EXISTS: 409,
    PeerErrorCode.PAYLOAD_TOO_LARGE: 413,
    PeerErrorCode.FAILED_PRECONDITION: 412,
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
    job_id: JobId
    nonce: RequiredNonce
    requester: Name
    owner_principal: Principal = ""
    submitting_user: Principal = ""
    submitted_at_ms: int = Field(default=0, ge=0, le=2**63 - 1)
    backend_id: Name = ""
    spec: dict[str, Any]

    @field_validator("spec")
    @classmethod
    def _no_nul(cls, spec: dict[str, Any]) -> dict[str, Any]:
        if (where := nul_path(spec, "spec")) is not None:
            raise PydanticCustomError("nul_character", "{where} must not contain a NUL character", {"where": where})
        return spec

    @classmethod
    def of(cls, handoff: Handoff) -> HandoffRequest:
        # The whole job travels inline (command, env, files): the peer cannot read our store.
        fields = {name: getattr(handoff, name) for name in cls.model_fields if name != "spec"}
        return cls(**fields, spec=handoff.spec.model_dump(mode="json", exclude=set(handoff.spec.parent_only)))


# What a report may hold: the sizes of the store's columns (a larger number would fail its write).
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
EpochMs = Annotated[int, Field(ge=0, le=2**63 - 1)]
MAX_ERROR_CHARS = 8 * KiB


class ReplicaStatus(Body):
    index: int = Field(ge=0, le=2**31 - 1)
    state: JobState
    exit_code: ExitCode | None = None


MAX_CHILDREN = 4096  # per root in one status: a tree larger than that is reported in part


class ChildStatus(Body):
    """A child of a handed-off root (optional in a status: older peers send none, older parents
    ignore it)."""

    job_id: JobIdText
    state: JobState
    exit_code: ExitCode | None = None
    error: str = Field(default="", max_length=MAX_ERROR_CHARS)
    started_at_ms: EpochMs | None = None
    finished_at_ms: EpochMs | None = None


class JobStatus(Body):
    job_id: str
    nonce: str
    state: JobState
    backend_id: str = ""
    error: str = ""
    exit_code: ExitCode | None = None
    started_at_ms: EpochMs | None = None
    finished_at_ms: EpochMs | None = None
    replicas: list[ReplicaStatus] = Field(default_factory=list)
    tombstone: bool = False
    # What a succeeded incarnation handed back at $IRIS_RESULT (JSON text). Optional: a peer
    # without results sends none, and an older parent ignores it.
    result: Annotated[str, Field(max_length=MAX_RESULT_BYTES)] | None = None
    # The root's tree as it runs there: its children, theirs, and so on (None: not reported).
    children: list[ChildStatus] | None = Field(default=None, max_length=MAX_CHILDREN)
    # The serving URL of each named port, minted by the peer running the job (None: not reported;
    # older peers send none, older parents ignore it). The parent accepts only the forms
    # core/serving.py's accepted_serving_urls allows.
    serving_urls: dict[PortName, ServingUrl] | None = Field(default=None, max_length=MAX_PORTS)

    @field_validator("result")
    @classmethod
    def _json_result(cls, result: str | None) -> str | None:
        """A result is the JSON the job wrote, checked again here: a peer's answer is not trusted."""
        if result is None:
            return None
        try:
            return parse_result(result.encode("utf-8"))
        except ResultError as error:
            raise PydanticCustomError("result", "{problem}", {"problem": str(error)}) from None

    @field_validator("error")
    @classmethod
    def _bounded_error(cls, error: str) -> str:
        """Cut to MAX_ERROR_CHARS: the parent keeps it on the job, and shows it in the task's log."""
        return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 6] + " [cut]"

    @classmethod
    def of(cls, report: JobReport) -> JobStatus:
        return cls.model_validate(report, from_attributes=True)

    def to_report(self) -> JobReport:
        children = None if self.children is None else tuple(projected(c, ChildReport) for c in self.children)
        return projected(
            self, JobReport, replicas=tuple(projected(r, ReplicaReport) for r in self.replicas), children=children
        )


class BundleStatus(Body):
    """Where a workdir bundle's upload to this cluster stands: ``received`` bytes of ``size``
    (``complete``: all of them, verified), and the most one chunk may carry here."""

    digest: str
    size: int = Field(ge=0)
    received: int = Field(ge=0)
    complete: bool
    max_chunk_bytes: int = Field(ge=1)


class HandoffResponse(Body):
    job: JobStatus
    replay: bool = False


class SyncRequest(Body):
    cursor: SyncCursor = ""


class SyncResponse(Body):
    deltas: list[JobStatus]
    next_cursor: SyncCursor
    cursor_stale: bool = False


class TerminateRequest(Body):
    job_id: JobId
    nonce: Nonce = ""  # only this incarnation, when given (a stray one left behind by a requeue)


class LogsResponse(Body):
    lines: list[str]
    next_cursor: LogCursor
    truncated: bool = False

    @field_validator("lines")
    @classmethod
    def _bounded_lines(cls, lines: list[str]) -> list[str]:
        """Each line cut to MAX_LOG_LINE_CHARS, NULs replaced (the parent's store cannot hold them)."""
        return [_bounded_line(line) for line in lines]


def _bounded_line(line: str) -> str:
    if len(line) > MAX_LOG_LINE_CHARS:
        line = line[: MAX_LOG_LINE_CHARS - 20] + " [line cut by iris]"
    return line.replace("\x00", "\ufffd")

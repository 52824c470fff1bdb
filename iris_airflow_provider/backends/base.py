"""What every backend offers: capacity in the seed's shape, idempotent submission, status, cancel, logs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from iris_airflow_provider.core.availability import PeerBackend

# The value backends report lives in the core; re-exported here for the backends that return it.
from iris_airflow_provider.core.job_report import JobReport as JobReport
from iris_airflow_provider.core.job_report import ReplicaReport as ReplicaReport
from iris_airflow_provider.core.job_result import MAX_RESULT_BYTES, RESULT_ENV, ResultError, parse_result, too_large
from iris_airflow_provider.core.model import JobSpec


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
    # What the cluster gives every job it launches, beside its spec's env: IRIS_FEDERATION_URL and
    # IRIS_JOB_TOKEN (services/job_tokens.py); none where the cluster issues no job tokens.
    job_env: Mapping[str, str] = field(default_factory=dict)


# A job's way back to its cluster (services/job_tokens.py): the api-server's URL and the job's token,
# which a backend keeping it in a file (the process backend) rewrites while the job runs.
FEDERATION_URL_ENV = "IRIS_FEDERATION_URL"
JOB_TOKEN_ENV = "IRIS_JOB_TOKEN"
JOB_TOKEN_FILE_ENV = "IRIS_JOB_TOKEN_FILE"


@dataclass(frozen=True, slots=True)
class LogChunk:
    """New log lines since ``cursor``; pass ``next_cursor`` next time to get only what follows."""

    lines: tuple[str, ...]
    next_cursor: str
    truncated: bool = False  # more was available than the bound allowed


class MalformedCursorError(ValueError):
    """A log cursor this backend did not mint (a caller's mistake, not the backend's)."""


Cursor = TypeVar("Cursor")


def decode_cursor(cursor: str, shape: TypeAdapter[Cursor], empty: Cursor) -> Cursor:
    """A backend's log cursor (JSON of ``shape``; ``empty`` for ""), or MalformedCursorError."""
    if not cursor:
        return empty
    try:
        return shape.validate_json(cursor)
    except ValidationError:
        raise MalformedCursorError(f"cursor {cursor[:100]!r} is not a log cursor this cluster returned") from None


@dataclass(frozen=True, slots=True)
class ServedPort:
    """Where this cluster reaches a running job's named port, and the incarnation serving it."""

    host: str
    port: int
    nonce: str


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

    def served_port(self, job_id: str, port_name: str) -> ServedPort | None:
        """Where the job's ``port_name`` is served now (see ``core/serving.py``), or None when it is not running."""
        ...


# Shared by the backends ---------------------------------------------------------------------------


def now_ms() -> int:
    """The wall clock in milliseconds: the default clock of backends and services (tests pass their own)."""
    return time.time_ns() // 1_000_000


def advertised_attributes(
    device_type: str, variants: Iterable[str], attributes: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """What a backend advertises: its device type, its extra attributes, and its device variants (if any)."""
    advertised = {"device-type": [device_type], **{key: list(values) for key, values in attributes.items()}}
    variants = sorted(variants)
    if variants:
        advertised["device-variant"] = variants
    return advertised


def job_identity_env(job_id: str, nonce: str, replicas: int, backend_id: str) -> dict[str, str]:
    """The ``IRIS_*`` variables that tell a replica which job, incarnation and backend it belongs to.

    ``job_id`` is the job's cluster-invariant id (its spec's, the one its submitter knows), also on a
    peer that keeps it under a namespaced key: a checkpoint path built from it survives a move."""
    return {
        "IRIS_JOB_ID": job_id,
        "IRIS_JOB_NONCE": nonce,
        "IRIS_NUM_REPLICAS": str(replicas),
        "IRIS_BACKEND_ID": backend_id,
    }


# torch.distributed's default ``MASTER_PORT``: where replica 0 listens unless a backend picks another.
DEFAULT_COORDINATOR_PORT = 29500
# The names that carry a replica's own rank: the same number under each launcher's name.
RANK_ENV = ("IRIS_REPLICA_INDEX", "RANK", "NODE_RANK")


def rendezvous_env(coordinator_host: str, coordinator_port: int, replicas: int) -> dict[str, str]:
    """What a launcher needs to bring a job's replicas together, the same for every replica: where
    replica 0 listens (``IRIS_COORDINATOR_ADDRESS`` for ``jax.distributed.initialize``, ``MASTER_ADDR``
    and ``MASTER_PORT`` for torch.distributed) and how many there are (``WORLD_SIZE``: one process per
    replica; a launcher starting several per replica counts them itself from ``IRIS_NUM_REPLICAS``).
    Each replica's rank is set alongside, under every name of ``RANK_ENV``."""
    return {
        "IRIS_COORDINATOR_ADDRESS": f"{coordinator_host}:{coordinator_port}",
        "MASTER_ADDR": coordinator_host,
        "MASTER_PORT": str(coordinator_port),
        "WORLD_SIZE": str(replicas),
    }


def read_result_file(path: Path) -> str | None:
    """The result a replica left at ``path`` (see ``core/job_result.py``): None when it wrote none,
    else its canonical JSON text; ResultError when it is too large or not JSON. Reads at most one
    byte past the limit, whatever the file's size."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_RESULT_BYTES + 1)
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ResultError(f"The job's result (the file at ${RESULT_ENV}) cannot be read: {error.strerror}") from None
    if len(data) > MAX_RESULT_BYTES:
        raise too_large(max(size, len(data)))
    return parse_result(data)


def replica_line(index: int, text: str) -> str:
    """One line of a job's output, as ``logs`` returns it: prefixed with the replica it came from."""
    return f"[replica {index}] {text}"

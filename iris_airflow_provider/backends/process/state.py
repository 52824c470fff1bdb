"""The process backend's state directory: every job it knows, as files any process can read.

Layout of ``<state_dir>``::

    backend.json            the backend's settings (the supervisor rebuilds the backend from it)
    observation.json        the availability last reported: an unchanged report keeps its epoch
    .lock                   held (flock) by whoever changes a job's status
    staging/                where a new job's directory is built, then moved to ``jobs/`` whole
    jobs/<job dir>/         one per job id (see ``job_directory_name``); a replaced incarnation's is
                            renamed ``<job dir>.<digest of its nonce>``
        job.json            what to run (``JobFile``), written once at submit
        status.json         what happened (``StatusFile``), rewritten atomically at each change
        workdir/            the files that travelled with the job; the replicas' working directory
        replica-<i>.log     replica i's output; ``replica-<i>.exit`` its exit code
        replica-<i>.result.json  what replica i wrote at ``$IRIS_RESULT`` (each replica has its own)
        result.json         replica 0's result, checked, once the job succeeded: what it hands back
        supervisor.log      the supervisor's own output

``status.json`` carries a ``version``; files without one (written before it existed) are read as
version 1, which has the same fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from iris_airflow_provider.core.availability import Availability
from iris_airflow_provider.core.bands import Band, parse_band
from iris_airflow_provider.core.wire import AvailabilityBlock

STATUS_VERSION = 1

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, KILLED = "succeeded", "failed", "killed"
FINISHED = (SUCCEEDED, FAILED, KILLED)
HOLDING = (STARTING, RUNNING)  # states in which a job holds its device slots
STATES = (QUEUED, STARTING, RUNNING, *FINISHED)


class StateError(ValueError):
    """A state file this code cannot read (a newer version, or a malformed one)."""


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """How the backend was configured: ``backend.json``."""

    backend_id: str
    devices: dict[str, int] = field(default_factory=dict)
    device_type: str = "cpu"
    attributes: dict[str, list[str]] = field(default_factory=dict)
    max_running_jobs: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackendSettings:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True, slots=True)
class JobFile:
    """What to run: ``job.json``. ``spec`` is the job's spec as JSON (``JobSpec.model_dump``)."""

    job_id: str
    nonce: str
    requester: str
    band: Band
    submitted_at_ms: int
    spec: dict[str, Any]
    need: dict[str, int]  # device slots per variant, for all replicas together
    # IRIS_FEDERATION_URL (no token: that lives in JOB_TOKEN_FILE, rewritten while the job runs).
    job_env: dict[str, str] = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return int(self.spec["resources"]["replicas"])

    @property
    def devices_per_replica(self) -> int:
        return int(self.spec["resources"]["device"]["count"])

    @property
    def command(self) -> list[str]:
        return list(self.spec.get("command") or [])

    @property
    def env(self) -> dict[str, str]:
        return dict(self.spec.get("env") or {})

    @property
    def port_names(self) -> list[str]:
        return [str(port["name"]) for port in self.spec.get("ports") or ()]

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nonce": self.nonce,
            "requester": self.requester,
            "band": self.band.wire_name,
            "submitted_at_ms": self.submitted_at_ms,
            "spec": self.spec,
            "need": self.need,
            "job_env": self.job_env,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobFile:
        band = parse_band(str(data["band"]))
        assert band is not None  # a job's band parses to one (unspecified is interactive)
        return cls(
            job_id=str(data["job_id"]),
            nonce=str(data["nonce"]),
            requester=str(data.get("requester", "")),
            band=band,
            submitted_at_ms=int(data["submitted_at_ms"]),
            spec=dict(data["spec"]),
            need={str(v): int(n) for v, n in (data.get("need") or {}).items()},
            job_env={str(k): str(v) for k, v in (data.get("job_env") or {}).items()},
        )


@dataclass(slots=True)
class StatusFile:
    """What happened to a job: ``status.json``. Unset fields are left out of the file."""

    state: str
    queued_at_ms: int | None = None
    attempts: int = 0  # runs started, including the current one
    preemptions: int | None = None  # times evicted back to the queue
    devices: dict[str, list[int]] = field(default_factory=dict)  # slots held while starting or running
    spawned_at_ms: int | None = None
    pid: int | None = None  # the supervisor's, which leads the job's session and process group
    pgid: int | None = None
    pid_start: int | None = None  # its start time in clock ticks: a recycled pid is not ours
    boot_id: str | None = None  # the machine's boot the supervisor started in: pids mean nothing after it
    started_at_ms: int | None = None
    cancel_requested_at_ms: int | None = None
    preempted_at_ms: int | None = None
    error: str | None = None
    exit_codes: list[int | None] | None = None
    failed_replica: int | None = None  # the replica whose failure ended the run
    finished_at_ms: int | None = None
    ports: list[dict[str, int]] | None = None  # per replica, the loopback port of each named port of this run

    @classmethod
    def queued(cls, now_ms: int, *, attempts: int = 0, preemptions: int | None = None) -> StatusFile:
        return cls(QUEUED, queued_at_ms=now_ms, attempts=attempts, preemptions=preemptions)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": STATUS_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "devices" and not value):
                continue
            data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatusFile:
        version = int(data.get("version", 1))
        if version > STATUS_VERSION:
            raise StateError(f"status.json version {version} is newer than this code reads ({STATUS_VERSION})")
        state = data.get("state")
        if state not in STATES:
            raise StateError(f"status.json has an unknown state {state!r}")
        ints = (
            *("queued_at_ms", "preemptions", "spawned_at_ms", "pid", "pgid", "pid_start", "started_at_ms"),
            *("cancel_requested_at_ms", "preempted_at_ms", "failed_replica", "finished_at_ms"),
        )
        codes = data.get("exit_codes")
        return cls(
            state=str(state),
            attempts=int(data.get("attempts", 0)),
            devices={str(v): [int(s) for s in slots] for v, slots in (data.get("devices") or {}).items()},
            error=None if data.get("error") is None else str(data["error"]),
            boot_id=None if data.get("boot_id") is None else str(data["boot_id"]),
            exit_codes=None if codes is None else [None if c is None else int(c) for c in codes],
            ports=None
            if data.get("ports") is None
            else [{str(name): int(number) for name, number in replica.items()} for replica in data["ports"]],
            **{name: None if data.get(name) is None else int(data[name]) for name in ints},
        )


@dataclass(slots=True)
class Job:
    """One job's directory and files, as last read."""

    directory: Path
    record: JobFile
    status: StatusFile

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def state(self) -> str:
        return self.status.state

    @property
    def band(self) -> Band:
        return self.record.band


class StateDir:
    """The state directory: the lock, and reading and writing jobs' files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.jobs_dir = self.root / "jobs"
        self.staging_dir = self.root / "staging"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.staging_dir.mkdir(exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with (self.root / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def last_observation(self) -> Availability | None:
        """The availability this backend last reported (its epoch names its numbers; see ``settled``)."""
        path = self.root / "observation.json"
        return AvailabilityBlock.model_validate(read_json(path)).to_core() if path.exists() else None

    def save_observation(self, availability: Availability) -> None:
        write_json(self.root / "observation.json", availability.to_wire())

    def write_settings(self, settings: BackendSettings) -> None:
        write_json(self.root / "backend.json", settings.to_json())

    @staticmethod
    def read_settings(root: str | Path) -> BackendSettings:
        return BackendSettings.from_json(read_json(Path(root) / "backend.json"))

    def directory(self, job_id: str) -> Path:
        return self.jobs_dir / job_directory_name(job_id)

    def load(self, job_id: str) -> Job | None:
        return load_job(self.directory(job_id))

    def require(self, job_id: str) -> Job:
        job = self.load(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def jobs(self) -> list[Job]:
        loaded = (load_job(directory) for directory in self.jobs_dir.iterdir())
        return [job for job in loaded if job is not None]

    def create(
        self,
        record: JobFile,
        status: StatusFile,
        files: Mapping[str, bytes],
        *,
        replacing: Job | None = None,
        unpack: Callable[[Path], None] | None = None,
    ) -> Job:
        """A new job's directory: its workdir files, ``job.json`` and ``status.json``, built aside in
        ``staging/`` and moved into place whole, after retiring ``replacing`` (a finished
        incarnation of the same id). A failure part way leaves nothing behind: no half-built job
        is ever visible, and the next submission of the id starts from scratch."""
        directory = self.directory(record.job_id)
        staging = self.staging_dir / f"{directory.name}.{_digest(record.nonce)}"
        shutil.rmtree(staging, ignore_errors=True)  # left by a process that died building it
        try:
            workdir = staging / "workdir"
            workdir.mkdir(parents=True)
            if unpack is not None:  # the job's workdir bundle
                unpack(workdir)
            for path, content in files.items():
                target = workdir / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("xb") as output:  # never over something already there
                    output.write(content)
            write_json(staging / "job.json", record.to_json())
            write_json(staging / "status.json", status.to_json())
            if replacing is not None:
                self.retire(replacing)
            elif directory.exists() and load_job(directory) is None:
                shutil.rmtree(directory)  # a job directory never completed (built in place before staging)
            staging.rename(directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return Job(directory, record, status)

    def retire(self, job: Job) -> None:
        """Move a finished incarnation's directory aside for the next one."""
        job.directory.rename(job.directory.with_name(f"{job.directory.name}.{_digest(job.record.nonce)}"))

    @staticmethod
    def save_status(job: Job) -> None:
        write_json(job.directory / "status.json", job.status.to_json())


def load_job(directory: Path) -> Job | None:
    """The job in ``directory``, or None when it has no (complete) job there."""
    if not ((directory / "status.json").exists() and (directory / "job.json").exists()):
        return None
    record = JobFile.from_json(read_json(directory / "job.json"))
    return Job(directory, record, StatusFile.from_json(read_json(directory / "status.json")))


def _digest(nonce: str) -> str:
    """A nonce as part of a file name: it comes from another cluster and may hold any character."""
    return hashlib.sha1(nonce.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def job_directory_name(job_id: str) -> str:
    """The job's directory under ``<state_dir>/jobs``: readable, and unique by a digest of the id."""
    readable = job_id.strip("/").replace("/", "__")[:80]
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


JOB_TOKEN_FILE = "job-token"


def write_job_token(directory: Path, token: str) -> None:
    """Replace the job's token file whole (a replica reading it sees the old token or the new one)."""
    path = directory / JOB_TOKEN_FILE
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.touch(mode=0o600)
    temporary.write_text(token)
    os.replace(temporary, path)


def read_job_token(directory: Path) -> tuple[Path, str]:
    """The job's token file and the token in it ("" when there is none)."""
    path = directory / JOB_TOKEN_FILE
    try:
        return path, path.read_text().strip()
    except FileNotFoundError:
        return path, ""


def result_file_name(replica: int | str) -> str:
    """Where replica ``replica`` is told to write its result (``$IRIS_RESULT``), in the job's directory."""
    return f"replica-{replica}.result.json"


RESULT_FILE = "result.json"


def write_result(directory: Path, result: str) -> None:
    """Keep the job's checked result (JSON text), atomically."""
    temporary = directory / f".{RESULT_FILE}.{os.getpid()}.tmp"
    temporary.write_text(result, encoding="utf-8")
    os.replace(temporary, directory / RESULT_FILE)


def read_result(directory: Path) -> str | None:
    """The job's checked result, or None when it handed none back."""
    try:
        return (directory / RESULT_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def read_json(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(path.read_text()))


def write_json(path: Path, data: Mapping[str, Any] | Sequence[Any]) -> None:
    """Write atomically: readers in other processes see the old file or the new one, never half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, path)

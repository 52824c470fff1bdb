"""The ``process`` backend: jobs run as local subprocesses, one per replica, on declared device slots.

It is a small cluster of its own, kept entirely in a state directory so that it survives every
Airflow process: a job runs under a detached supervisor (its own session, tracked by pid), which
starts the replicas, records their exit codes and output, and on exit starts whatever the freed
slots let start. Any process holding the state directory (a worker, the triggerer, the tick)
sees the same jobs, so a scheduler, worker or triggerer restart neither kills nor forgets them.

Scheduling mirrors Kueue's contract with the federation: a job waits in the backend's queue
(band rank, then submit time) until its devices are free; a job may evict strictly lower-band
work to start, and evicted work goes back to the queue. Capacity is reported per device variant
in the seed's availability shape, with what running work holds per band.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    InsufficientCapacityError,
    JobReport,
    LogChunk,
    ReplicaReport,
    Submission,
    SubmissionRefusedError,
    SubmitOutcome,
)
from iris_airflow_provider.federation.availability import Availability, PeerBackend
from iris_airflow_provider.federation.bands import Band, parse_band
from iris_airflow_provider.federation.constraints import normalize_advertised
from iris_airflow_provider.federation.model import JobSpec, file_bytes
from iris_airflow_provider.federation.states import JobState

# Environment a job starts from: enough to find programs, nothing that could carry a credential.
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")
# The supervisor's own environment: what Python needs to start, nothing more. A job can read its
# parent's (the supervisor's) environment through /proc, so the caller's credentials must not be in it.
SUPERVISOR_ENV_KEYS = (*BASE_ENV_KEYS, "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")
SUPERVISOR_START_GRACE_MS = 30_000
KILL_GRACE_SECONDS = 10

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
FINISHED = ("succeeded", "failed", "killed")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Job:
    """One job's files: ``job.json`` (what to run) and ``status.json`` (what happened)."""

    directory: Path
    job: dict[str, Any]
    status: dict[str, Any]

    @property
    def state(self) -> str:
        return str(self.status["state"])

    @property
    def band(self) -> Band:
        band = parse_band(self.job["band"])
        assert band is not None
        return band

    @property
    def devices(self) -> dict[str, list[int]]:
        return {variant: list(slots) for variant, slots in self.status.get("devices", {}).items()}

    def queue_key(self) -> tuple[int, int, str]:
        return (self.band.rank, int(self.job["submitted_at_ms"]), str(self.job["job_id"]))


class ProcessBackend:
    kind = "process"

    def __init__(
        self,
        backend_id: str,
        state_dir: str | Path,
        *,
        devices: Mapping[str, int] | None = None,
        device_type: str | None = None,
        attributes: Mapping[str, Sequence[str]] | None = None,
        max_running_jobs: int | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.backend_id = backend_id
        self.state_dir = Path(state_dir)
        self.devices = {variant.lower(): int(slots) for variant, slots in (devices or {}).items()}
        self.device_type = device_type or ("gpu" if self.devices else "cpu")
        self.attributes = {k: list(v) for k, v in (attributes or {}).items()}
        self.max_running_jobs = max_running_jobs
        self.env = dict(env or {})
        self.clock = clock
        self.jobs_dir = self.state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        # The supervisor rebuilds this backend from here to start queued work when it exits.
        _write_json(self.state_dir / "backend.json", self.settings())

    def settings(self) -> dict[str, Any]:
        return {
            "backend_id": self.backend_id,
            "devices": self.devices,
            "device_type": self.device_type,
            "attributes": self.attributes,
            "max_running_jobs": self.max_running_jobs,
            "env": self.env,
        }

    @classmethod
    def from_state_dir(cls, state_dir: str | Path) -> ProcessBackend:
        settings = json.loads((Path(state_dir) / "backend.json").read_text())
        return cls(state_dir=state_dir, **settings)

    # Heartbeat ---------------------------------------------------------------------------------

    def advertised(self) -> dict[str, list[str]]:
        advertised = {"device-type": [self.device_type], **self.attributes}
        if self.devices:
            advertised["device-variant"] = sorted(self.devices)
        return advertised

    def describe(self) -> PeerBackend:
        with self._locked():
            self._reconcile()
            running = [job for job in self._jobs() if job.state in (STARTING, RUNNING)]
        used: dict[str, int] = {}
        held: dict[Band, dict[str, int]] = {}
        for job in running:
            for variant, slots in job.devices.items():
                used[variant] = used.get(variant, 0) + len(slots)
                by_band = held.setdefault(job.band, {})
                by_band[variant] = by_band.get(variant, 0) + len(slots)
        availability = Availability(
            version=2,
            observation_epoch_ms=self.clock(),
            amounts={variant: max(0, total - used.get(variant, 0)) for variant, total in self.devices.items()},
            total_amounts=dict(self.devices),
            held_by_band=held,
        )
        return PeerBackend(self.backend_id, normalize_advertised(self.advertised()), availability, self.kind)

    # Jobs --------------------------------------------------------------------------------------

    def submit(self, submission: Submission) -> SubmitOutcome:
        need = self._need(submission.spec)
        with self._locked():
            existing = self._load(submission.job_id)
            if existing is not None:
                if existing.job["nonce"] == submission.nonce:
                    return SubmitOutcome(self._report(existing), replay=True)
                if existing.state not in FINISHED:
                    raise AlreadyExistsError(
                        f"Job {submission.job_id} is still running here as another incarnation "
                        f"(nonce {existing.job['nonce']})"
                    )
                existing.directory.rename(
                    existing.directory.with_name(existing.directory.name + "." + existing.job["nonce"])
                )
            directory = self._directory(submission.job_id)
            workdir = directory / "workdir"
            workdir.mkdir(parents=True)
            for path, content in submission.spec.files.items():  # the files that travelled with the job
                target = workdir / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(file_bytes(content))
            job = {
                "job_id": submission.job_id,
                "nonce": submission.nonce,
                "requester": submission.requester,
                "band": submission.spec.priority_band.wire_name,
                "submitted_at_ms": submission.submitted_at_ms,
                "spec": submission.spec.model_dump(mode="json"),
                "need": need,
            }
            _write_json(directory / "job.json", job)
            _write_json(directory / "status.json", {"state": QUEUED, "queued_at_ms": self.clock(), "attempts": 0})
            self._schedule()
            return SubmitOutcome(self._report(self._require(submission.job_id)))

    def status(self, job_id: str) -> JobReport | None:
        with self._locked():
            self._reconcile()
            job = self._load(job_id)
            return self._report(job) if job else None

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobReport]:
        with self._locked():
            self._reconcile()
            reports = {}
            for job_id in job_ids:
                job = self._load(job_id)
                if job is not None:
                    reports[job_id] = self._report(job)
            return reports

    def live_job_ids(self) -> list[str]:
        """Jobs queued or running here."""
        with self._locked():
            return sorted(str(job.job["job_id"]) for job in self._jobs() if job.state not in FINISHED)

    def cancel(self, job_id: str) -> bool:
        with self._locked():
            job = self._load(job_id)
            if job is None:
                return False
            if job.state == QUEUED:
                self._finish(job, "killed", error="Cancelled while queued")
            elif job.state in (STARTING, RUNNING):
                job.status["cancel_requested_at_ms"] = self.clock()
                self._save_status(job)
                _signal_group(job.status.get("pgid"), signal.SIGTERM)
            return True

    def logs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk:
        job = self._load(job_id)
        if job is None:
            return LogChunk((), cursor)
        offsets: dict[str, int] = json.loads(cursor) if cursor else {}
        finished = job.state in FINISHED  # nothing more will be written: a last partial line is whole
        lines: list[str] = []
        truncated = False
        for index in range(int(job.job["spec"]["resources"]["replicas"])):
            path = job.directory / f"replica-{index}.log"
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offsets.get(str(index), 0))
                while True:
                    position = handle.tell()
                    raw = handle.readline()
                    # Nothing more, or a partial line: read it whole next time (unless the job has ended).
                    if not raw or (not raw.endswith(b"\n") and not finished):
                        handle.seek(position)
                        break
                    if len(lines) >= max_lines:
                        truncated = True
                        handle.seek(position)
                        break
                    lines.append(f"[replica {index}] {raw.decode(errors='replace').rstrip()}")
                offsets[str(index)] = handle.tell()
        return LogChunk(tuple(lines), json.dumps(offsets, sort_keys=True), truncated)

    # Called by the supervisor when its job ends ------------------------------------------------

    def supervisor_finished(
        self,
        job_id: str,
        exit_codes: Sequence[int | None],
        error: str,
        failed_replica: int | None = None,
        *,
        nonce: str,
        attempt: int,
    ) -> None:
        """The run ``attempt`` of incarnation ``nonce`` ended. ``failed_replica``: the replica whose
        failure ended it (the others were stopped after it).

        A report from another incarnation or attempt (one the reaper already settled, late) is ignored.
        """
        with self._locked():
            job = self._require(job_id)
            if job.state not in (STARTING, RUNNING):
                return
            if job.job["nonce"] != nonce or int(job.status.get("attempts", 0)) != attempt:
                return
            if failed_replica is not None:
                job.status["failed_replica"] = failed_replica
            if job.status.get("preempted_at_ms"):
                self._requeue(job)
            elif job.status.get("cancel_requested_at_ms"):
                self._finish(job, "killed", error="Cancelled", exit_codes=exit_codes)
            elif all(code == 0 for code in exit_codes):
                self._finish(job, "succeeded", exit_codes=exit_codes)
            else:
                self._finish(job, "failed", error=error, exit_codes=exit_codes)
            self._schedule()

    # Internals (callers hold the lock) ---------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.state_dir / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _need(self, spec: JobSpec) -> dict[str, int]:
        """The device slots a job takes here, or a refusal naming what is missing."""
        device = spec.resources.device
        if device.type == "cpu":
            return {}
        if device.type != self.device_type:
            raise SubmissionRefusedError(f"backend {self.backend_id} has {self.device_type} devices, not {device.type}")
        variants = [device.variant] if device.variant != "auto" else sorted(self.devices)
        for variant in variants:
            total = self.devices.get(variant, 0)
            if total >= device.count * spec.resources.replicas:
                return {variant: device.count * spec.resources.replicas}
        # Too few of a variant it has: another cluster may be larger. None of it at all: a wrong shape.
        refusal = InsufficientCapacityError if any(v in self.devices for v in variants) else SubmissionRefusedError
        raise refusal(
            f"backend {self.backend_id} cannot ever host {spec.resources.replicas} x {device.count} "
            f"{device.variant}: it has {self.devices or 'no devices'}"
        )

    def _directory(self, job_id: str) -> Path:
        return self.jobs_dir / job_directory_name(job_id)

    def _load(self, job_id: str) -> _Job | None:
        directory = self._directory(job_id)
        if not (directory / "status.json").exists():
            return None
        return _Job(directory, _read_json(directory / "job.json"), _read_json(directory / "status.json"))

    def _require(self, job_id: str) -> _Job:
        job = self._load(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def _jobs(self) -> list[_Job]:
        jobs = []
        for directory in self.jobs_dir.iterdir():
            if (directory / "status.json").exists() and (directory / "job.json").exists():
                jobs.append(_Job(directory, _read_json(directory / "job.json"), _read_json(directory / "status.json")))
        return jobs

    def _save_status(self, job: _Job) -> None:
        _write_json(job.directory / "status.json", job.status)

    def _finish(
        self, job: _Job, state: str, *, error: str = "", exit_codes: Sequence[int | None] | None = None
    ) -> None:
        job.status.update(state=state, error=error, finished_at_ms=self.clock())
        if exit_codes is not None:
            job.status["exit_codes"] = list(exit_codes)
        self._save_status(job)

    def _requeue(self, job: _Job) -> None:
        job.status = {
            "state": QUEUED,
            "queued_at_ms": self.clock(),
            "attempts": int(job.status.get("attempts", 0)),
            "preemptions": int(job.status.get("preemptions", 0)) + 1,
        }
        self._save_status(job)

    def _reconcile(self) -> None:
        """Settle jobs whose supervisor died without recording an end, then start what fits."""
        changed = False
        for job in self._jobs():
            if job.state not in (STARTING, RUNNING):
                continue
            pid = job.status.get("pid")
            alive = pid is not None and _alive(pid, job.status.get("pid_start"))
            if alive:
                continue
            if pid is None and self.clock() - int(job.status.get("spawned_at_ms", 0)) < SUPERVISOR_START_GRACE_MS:
                continue
            # Its replicas outlive it (adopted by init) and would keep the slots we are about to free.
            if _job_group_alive(job.status.get("pgid"), str(job.job["nonce"])):
                _signal_group(job.status.get("pgid"), signal.SIGKILL)
            if job.status.get("preempted_at_ms"):
                self._requeue(job)
            elif job.status.get("cancel_requested_at_ms"):
                self._finish(job, "killed", error="Cancelled")
            else:
                self._finish(job, "failed", error="The job's supervisor process died")
            changed = True
        if changed or any(job.state == QUEUED for job in self._jobs()):
            self._schedule()

    def _schedule(self) -> None:
        """Start queued jobs in queue order wherever their devices are free; evict lower bands if needed."""
        jobs = self._jobs()
        queued = sorted((j for j in jobs if j.state == QUEUED), key=_Job.queue_key)
        running = [j for j in jobs if j.state in (STARTING, RUNNING)]
        # Slots of jobs already being evicted: freed soon, and already promised to whoever evicted them.
        draining: dict[str, int] = {}
        for evicted in (j for j in running if j.status.get("preempted_at_ms")):
            for variant, slots in evicted.devices.items():
                draining[variant] = draining.get(variant, 0) + len(slots)
        for job in queued:
            need: dict[str, int] = job.job["need"]
            if self.max_running_jobs is not None and len(running) >= self.max_running_jobs:
                # Every run slot is taken: a higher band frees one by evicting the lowest-band,
                # newest job (unless one is already on its way out), like it would free devices.
                if not any(r.status.get("preempted_at_ms") for r in running):
                    for victim in _eviction_order(job, running)[:1]:
                        self._evict(victim)
                break
            free = self._free_slots(running)
            if all(len(free.get(v, [])) >= n for v, n in need.items()):
                self._start(job, {v: free[v][:n] for v, n in need.items()})
                running.append(job)
                continue
            for victim in self._victims(job, need, running, free, draining):
                self._evict(victim)

    def _evict(self, victim: _Job) -> None:
        """Tell a running job to stop; it goes back to the queue when it has (see the supervisor)."""
        victim.status["preempted_at_ms"] = self.clock()
        self._save_status(victim)
        _signal_group(victim.status.get("pgid"), signal.SIGTERM)

    def _free_slots(self, running: Sequence[_Job]) -> dict[str, list[int]]:
        taken: dict[str, set[int]] = {}
        for job in running:
            for variant, slots in job.devices.items():
                taken.setdefault(variant, set()).update(slots)
        return {v: [s for s in range(total) if s not in taken.get(v, set())] for v, total in self.devices.items()}

    def _victims(
        self,
        job: _Job,
        need: Mapping[str, int],
        running: Sequence[_Job],
        free: Mapping[str, list[int]],
        draining: dict[str, int],
    ) -> list[_Job]:
        """Lower-band running jobs whose eviction frees enough for ``job``: lowest band, newest first.

        Slots still held by jobs already being evicted (``draining``) count as freed: evicting more
        while they drain would take more than ``job`` needs. The job claims the draining slots it
        counts on, so the next queued job does not count them too.
        """
        claimed = {v: min(draining.get(v, 0), max(0, n - len(free.get(v, [])))) for v, n in need.items()}
        candidates = _eviction_order(job, running)
        chosen: list[_Job] = []
        available = {v: len(free.get(v, [])) + claimed[v] for v in need}
        for candidate in candidates:
            if all(available[v] >= n for v, n in need.items()):
                break
            gives = candidate.devices
            if not any(v in gives for v in need):
                continue
            chosen.append(candidate)
            for v in need:
                available[v] += len(gives.get(v, []))
        if not all(available[v] >= n for v, n in need.items()):
            return []
        for v, n in claimed.items():
            draining[v] = draining.get(v, 0) - n
        return chosen

    def _start(self, job: _Job, devices: dict[str, list[int]]) -> None:
        job.status.update(
            state=STARTING,
            devices=devices,
            spawned_at_ms=self.clock(),
            attempts=int(job.status.get("attempts", 0)) + 1,
        )
        for key in ("error", "exit_codes", "finished_at_ms", "pid", "pgid", "pid_start", "preempted_at_ms"):
            job.status.pop(key, None)
        self._save_status(job)
        try:
            pid = _spawn_supervisor(self.state_dir, job.directory.name)
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            self._finish(job, "failed", error=f"Could not start the job's supervisor: {error}")
            return
        job.status.update(state=RUNNING, pid=pid, pgid=pid, pid_start=_start_time(pid), started_at_ms=self.clock())
        self._save_status(job)

    def environment(self, job: dict[str, Any], replica: int, devices: Mapping[str, list[int]]) -> dict[str, str]:
        """A replica's environment: a clean base, the backend's defaults, then the job's own env (it wins)."""
        spec = job["spec"]
        env = {key: os.environ[key] for key in BASE_ENV_KEYS if key in os.environ}
        env.update(self.env)
        env.update(
            IRIS_JOB_ID=job["job_id"],
            IRIS_JOB_NONCE=job["nonce"],
            IRIS_REPLICA_INDEX=str(replica),
            IRIS_NUM_REPLICAS=str(spec["resources"]["replicas"]),
            IRIS_BACKEND_ID=self.backend_id,
        )
        per_replica = int(spec["resources"]["device"]["count"])
        if self.device_type == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # unset would mean every GPU of the machine
        for variant, slots in devices.items():
            mine = slots[replica * per_replica : (replica + 1) * per_replica]
            env["IRIS_DEVICE_VARIANT"] = variant
            if self.device_type == "gpu":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in mine)
            env["IRIS_DEVICE_SLOTS"] = ",".join(str(s) for s in mine)
        env.update(spec.get("env", {}))
        return env

    def _report(self, job: _Job) -> JobReport:
        status = job.status
        state = {
            QUEUED: JobState.PENDING,
            STARTING: JobState.ACCEPTED,
            RUNNING: JobState.RUNNING,
            "succeeded": JobState.SUCCEEDED,
            "failed": JobState.FAILED,
            "killed": JobState.KILLED,
        }[job.state]
        codes = status.get("exit_codes") or []
        replicas = tuple(ReplicaReport(i, _replica_state(state, code), code) for i, code in enumerate(codes)) or tuple(
            ReplicaReport(i, state) for i in range(int(job.job["spec"]["resources"]["replicas"]))
        )
        failing = [c for c in codes if c not in (0, None)]
        first = status.get("failed_replica")
        if first is not None and 0 <= first < len(codes) and codes[first] not in (0, None):
            failing.insert(0, codes[first])  # the replica that failed first, not one stopped because of it
        return JobReport(
            job_id=job.job["job_id"],
            nonce=job.job["nonce"],
            state=state,
            backend_id=self.backend_id,
            error=status.get("error", ""),
            exit_code=failing[0] if failing else (0 if state is JobState.SUCCEEDED else None),
            started_at_ms=status.get("started_at_ms"),
            finished_at_ms=status.get("finished_at_ms"),
            replicas=replicas,
        )


def job_directory_name(job_id: str) -> str:
    """The job's directory under ``<state_dir>/jobs``: readable, and unique by a digest of the id."""
    readable = job_id.strip("/").replace("/", "__")[:80]
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


def _replica_state(job_state: JobState, code: int | None) -> JobState:
    if code is None:
        return job_state
    return JobState.SUCCEEDED if code == 0 else JobState.FAILED


def _read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write atomically: readers in other processes see the old file or the new one, never half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, path)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks, so a recycled pid is not mistaken for our supervisor."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
    except OSError:
        return False
    return start is None or _start_time(pid) == start


def _job_group_alive(pgid: int | None, nonce: str) -> bool:
    """Whether processes of this job incarnation still run in its process group.

    The group id is the dead supervisor's pid, which may have been recycled (after a reboot, say):
    only a process carrying the incarnation's ``IRIS_JOB_NONCE`` proves the group is still ours.
    """
    if pgid is None:
        return False
    marker = f"IRIS_JOB_NONCE={nonce}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pgid:
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _spawn_supervisor(state_dir: Path, job_directory: str) -> int:
    """Start the job's supervisor fully detached (double fork, own session); return its pid."""
    launcher = subprocess.run(
        [sys.executable, "-m", "iris_airflow_provider.backends._supervisor", str(state_dir), job_directory],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
        timeout=60,
        close_fds=True,
        env={key: os.environ[key] for key in SUPERVISOR_ENV_KEYS if key in os.environ},
    )
    return int(launcher.stdout.decode().strip())


__all__ = ["KILL_GRACE_SECONDS", "ProcessBackend"]


def _eviction_order(job: _Job, running: Sequence[_Job]) -> list[_Job]:
    """The running jobs ``job`` may evict, in the order it evicts them: lowest band, then newest first."""
    return sorted(
        (r for r in running if job.band.outranks(r.band) and not r.status.get("preempted_at_ms")),
        key=lambda r: (-r.band.rank, -int(r.status.get("started_at_ms", 0))),
    )

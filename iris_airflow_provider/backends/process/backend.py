"""The ``process`` backend: jobs run as local subprocesses, one per replica, on declared device slots.

It is a small cluster of its own, kept entirely in a state directory (``state.py``) so that it
survives every Airflow process: a job runs under a detached supervisor (``supervisor.py``, its own
session, tracked by pid), which starts the replicas, records their exit codes and output, kills
whatever they left running in its session, and on exit starts whatever the freed slots let start.
A supervisor that dies is found on the next look at the state (``_reconcile``): what is left in its
session is killed, and its job ends. Any process holding the state directory (a worker,
the triggerer, the tick) sees the same jobs, so a scheduler, worker or triggerer restart neither
kills nor forgets them. What a job may take is checked before anything is written (``admission.py``);
each replica starts with the environment of ``environment.py``.

Scheduling mirrors Kueue's contract with the federation: a job waits in the backend's queue
(band rank, then submit time) until its devices are free; a job may evict strictly lower-band
work to start, and evicted work goes back to the queue. Which jobs start and which are evicted is
decided by the pure :func:`~iris_airflow_provider.core.eviction.plan_pass`; this class carries the
plan out. Capacity is reported per device variant in the seed's availability shape, with what
running work holds per band.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from iris_airflow_provider.backends.base import (
    JOB_TOKEN_ENV,
    AlreadyExistsError,
    JobReport,
    LogChunk,
    ServedPort,
    Submission,
    SubmitOutcome,
    advertised_attributes,
    now_ms,
    read_result_file,
)
from iris_airflow_provider.backends.bundles import BundleSource
from iris_airflow_provider.backends.process import processes
from iris_airflow_provider.backends.process.admission import bundle_unpacker, device_need
from iris_airflow_provider.backends.process.logs import read_logs
from iris_airflow_provider.backends.process.report import job_report
from iris_airflow_provider.backends.process.state import (
    FAILED,
    FINISHED,
    HOLDING,
    KILLED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    BackendSettings,
    Job,
    JobFile,
    StateDir,
    StatusFile,
    job_directory_name,
    result_file_name,
    write_job_token,
    write_result,
)
from iris_airflow_provider.core.availability import Availability, PeerBackend, settled
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.eviction import Limits, QueuedJob, RunningJob, plan_pass
from iris_airflow_provider.core.job_files import file_bytes
from iris_airflow_provider.core.job_result import ResultError

SUPERVISOR_START_GRACE_MS = 30_000
KILL_GRACE_SECONDS = 10


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
        bundles: BundleSource | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.backend_id = backend_id
        self.state_dir = Path(state_dir)
        self.devices = {variant.lower(): int(slots) for variant, slots in (devices or {}).items()}
        self.device_type = device_type or ("gpu" if self.devices else "cpu")
        self.attributes = {k: list(v) for k, v in (attributes or {}).items()}
        self.max_running_jobs = max_running_jobs
        self.env = dict(env or {})
        self.bundles = bundles  # where it unpacks jobs' workdir bundles from (none: it takes no bundle)
        self.clock = clock
        self.store = StateDir(self.state_dir)
        self.jobs_dir = self.store.jobs_dir
        # The supervisor rebuilds this backend from here to start queued work when it exits.
        self.store.write_settings(self.settings())

    @property
    def max_bundle_bytes(self) -> int:
        return self.bundles.max_bundle_bytes if self.bundles is not None else 0

    def settings(self) -> BackendSettings:
        return BackendSettings(
            backend_id=self.backend_id,
            devices=dict(self.devices),
            device_type=self.device_type,
            attributes={k: list(v) for k, v in self.attributes.items()},
            max_running_jobs=self.max_running_jobs,
            env=dict(self.env),
        )

    @classmethod
    def from_state_dir(cls, state_dir: str | Path) -> ProcessBackend:
        """The backend as :meth:`settings` wrote it to ``state_dir`` (each setting is an argument of its own name)."""
        return cls(state_dir=state_dir, **StateDir.read_settings(state_dir).to_json())

    # Heartbeat ---------------------------------------------------------------------------------

    def advertised(self) -> dict[str, list[str]]:
        return advertised_attributes(self.device_type, self.devices, self.attributes)

    def describe(self) -> PeerBackend:
        """Free and total slots per variant, and what running work holds per band. The observation
        epoch changes only when those numbers do (``settled``), in every process reading this state
        directory alike: it is kept there."""
        with self.store.locked():
            self._reconcile()
            running = [job for job in self.store.jobs() if job.state in HOLDING]
            used: dict[str, int] = {}
            held: dict[Band, dict[str, int]] = {}
            for job in running:
                for variant, slots in job.status.devices.items():
                    used[variant] = used.get(variant, 0) + len(slots)
                    by_band = held.setdefault(job.band, {})
                    by_band[variant] = by_band.get(variant, 0) + len(slots)
            measured = Availability(
                version=2,
                observation_epoch_ms=self.clock(),
                amounts={variant: max(0, total - used.get(variant, 0)) for variant, total in self.devices.items()},
                total_amounts=dict(self.devices),
                held_by_band=held,
            )
            previous = self.store.last_observation()
            availability = settled(previous, measured)
            if availability != previous:
                self.store.save_observation(availability)
        return PeerBackend(self.backend_id, normalize_advertised(self.advertised()), availability, self.kind)

    # Jobs --------------------------------------------------------------------------------------

    def submit(self, submission: Submission) -> SubmitOutcome:
        need = device_need(submission.spec, self.settings())
        with self.store.locked():
            existing = self.store.load(submission.job_id)
            if existing is not None:
                if existing.record.nonce == submission.nonce:
                    return SubmitOutcome(self._report(existing), replay=True)
                if existing.state not in FINISHED:
                    raise AlreadyExistsError(
                        f"Job {submission.job_id} is still running here as another incarnation "
                        f"(nonce {existing.record.nonce})"
                    )
            record = JobFile(
                job_id=submission.job_id,
                nonce=submission.nonce,
                requester=submission.requester,
                band=submission.spec.priority_band,
                submitted_at_ms=submission.submitted_at_ms,
                spec=submission.spec.model_dump(mode="json"),
                need=need,
                job_env={k: v for k, v in submission.job_env.items() if k != JOB_TOKEN_ENV},
            )
            files = {path: file_bytes(content) for path, content in submission.spec.files.items()}
            # Built aside and moved into place whole (the finished incarnation retired only then):
            # a failure writing it leaves the id as it was.
            job = self.store.create(
                record,
                StatusFile.queued(self.clock()),
                files,
                replacing=existing,
                unpack=bundle_unpacker(submission.spec, self.bundles, self.backend_id),
            )
            token = submission.job_env.get(JOB_TOKEN_ENV)
            if token:  # before any replica can start and read it
                write_job_token(job.directory, token)
            self._schedule()
            return SubmitOutcome(self._report(self.store.require(submission.job_id)))

    def status(self, job_id: str) -> JobReport | None:
        with self.store.locked():
            self._reconcile()
            job = self.store.load(job_id)
            return self._report(job) if job else None

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobReport]:
        with self.store.locked():
            self._reconcile()
            reports = {}
            for job_id in job_ids:
                job = self.store.load(job_id)
                if job is not None:
                    reports[job_id] = self._report(job)
            return reports

    def live_job_ids(self) -> list[str]:
        """Jobs queued or running here."""
        with self.store.locked():
            return sorted(job.job_id for job in self.store.jobs() if job.state not in FINISHED)

    def cancel(self, job_id: str) -> bool:
        with self.store.locked():
            job = self.store.load(job_id)
            if job is None:
                return False
            if job.state == QUEUED:
                self._finish(job, KILLED, error="Cancelled while queued")
            elif job.state in HOLDING:
                job.status.cancel_requested_at_ms = self.clock()
                self.store.save_status(job)
                processes.signal_group(job.status.pgid, signal.SIGTERM)
            return True

    def write_job_token(self, job_id: str, nonce: str, token: str) -> bool:
        """Rewrite the token of incarnation ``nonce`` (its replicas read the file, $IRIS_JOB_TOKEN_FILE);
        False when that incarnation is not here or has finished."""
        with self.store.locked():
            job = self.store.load(job_id)
            if job is None or job.record.nonce != nonce or job.state in FINISHED:
                return False
            write_job_token(job.directory, token)
            return True

    def logs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk:
        job = self.store.load(job_id)
        if job is None:
            return LogChunk((), cursor)
        # A finished job writes nothing more: a last partial line is whole.
        finished = job.state in FINISHED
        return read_logs(job.directory, job.record.replicas, finished=finished, cursor=cursor, max_lines=max_lines)

    def served_port(self, job_id: str, port_name: str) -> ServedPort | None:
        """Where replica 0 of ``job_id``'s current run serves ``port_name`` (on loopback), and which
        incarnation that run is; None unless the job is running here with that port."""
        job = self.store.load(job_id)
        if job is None or job.state not in (STARTING, RUNNING) or not job.status.ports:
            return None
        number = job.status.ports[0].get(port_name)
        return None if number is None else ServedPort("127.0.0.1", number, job.record.nonce)

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
        with self.store.locked():
            job = self.store.require(job_id)
            if job.state not in HOLDING:
                return
            if job.record.nonce != nonce or job.status.attempts != attempt:
                return
            if failed_replica is not None:
                job.status.failed_replica = failed_replica
            if job.status.preempted_at_ms:
                self._requeue(job)
            elif job.status.cancel_requested_at_ms:
                self._finish(job, KILLED, error="Cancelled", exit_codes=exit_codes)
            elif all(code == 0 for code in exit_codes):
                self._succeed(job, exit_codes)
            else:
                self._finish(job, FAILED, error=error, exit_codes=exit_codes)
            self._schedule()

    # Internals (callers hold the lock) ---------------------------------------------------------

    def _directory(self, job_id: str) -> Path:
        return self.store.directory(job_id)

    def _report(self, job: Job) -> JobReport:
        return job_report(job, self.backend_id)

    def _finish(self, job: Job, state: str, *, error: str = "", exit_codes: Sequence[int | None] | None = None) -> None:
        job.status.state, job.status.error, job.status.finished_at_ms = state, error, self.clock()
        if exit_codes is not None:
            job.status.exit_codes = list(exit_codes)
        self.store.save_status(job)

    def _succeed(self, job: Job, exit_codes: Sequence[int | None]) -> None:
        """Every replica exited 0: the job succeeds with replica 0's result (if it wrote one), which
        is checked now, once; a result that cannot be handed back fails the job saying why."""
        try:
            result = read_result_file(job.directory / result_file_name(0))
        except ResultError as problem:
            self._finish(job, FAILED, error=str(problem), exit_codes=exit_codes)
            return
        if result is not None:
            write_result(job.directory, result)
        self._finish(job, SUCCEEDED, exit_codes=exit_codes)

    def _requeue(self, job: Job) -> None:
        job.status = StatusFile.queued(
            self.clock(), attempts=job.status.attempts, preemptions=(job.status.preemptions or 0) + 1
        )
        self.store.save_status(job)

    def _reconcile(self) -> None:
        """Settle jobs whose supervisor died without recording an end, then start what fits."""
        changed = False
        for job in self.store.jobs():
            if job.state not in HOLDING:
                continue
            status = job.status
            if status.pid is not None and processes.alive(status.pid, status.pid_start):
                continue
            if status.pid is None and self.clock() - (status.spawned_at_ms or 0) < SUPERVISOR_START_GRACE_MS:
                continue
            # Its replicas outlive it (adopted by init) and would keep the slots we are about to
            # free: they are found by its session, which a job's env cannot change.
            processes.reap_orphaned_session(status.pid, status.pid_start, status.boot_id)
            if status.preempted_at_ms:
                self._requeue(job)
            elif status.cancel_requested_at_ms:
                self._finish(job, KILLED, error="Cancelled")
            else:
                self._finish(job, FAILED, error="The job's supervisor process died")
            changed = True
        if changed or any(job.state == QUEUED for job in self.store.jobs()):
            self._schedule()

    def _schedule(self) -> None:
        """Carry out one scheduling pass (``core.eviction.plan_pass``): evict, then start."""
        # Only live jobs: a replaced incarnation's directory holds a finished job of the same id.
        jobs = {job.job_id: job for job in self.store.jobs() if job.state not in FINISHED}
        queued = [
            QueuedJob(job.job_id, job.band, job.record.submitted_at_ms, job.record.need)
            for job in jobs.values()
            if job.state == QUEUED
        ]
        running = [
            RunningJob(
                job.job_id,
                job.band,
                {variant: tuple(slots) for variant, slots in job.status.devices.items()},
                job.status.started_at_ms or 0,
                evicting=bool(job.status.preempted_at_ms),
            )
            for job in jobs.values()
            if job.state in HOLDING
        ]
        plan = plan_pass(queued, running, Limits(self.devices, self.max_running_jobs))
        for job_id in plan.evictions:
            self._evict(jobs[job_id])
        for start in plan.starts:
            self._start(jobs[start.job_id], {variant: list(slots) for variant, slots in start.slots.items()})

    def _evict(self, victim: Job) -> None:
        """Tell a running job to stop; it goes back to the queue when it has (see the supervisor)."""
        victim.status.preempted_at_ms = self.clock()
        self.store.save_status(victim)
        processes.signal_group(victim.status.pgid, signal.SIGTERM)

    def _start(self, job: Job, devices: dict[str, list[int]]) -> None:
        status = job.status
        status.state, status.devices, status.spawned_at_ms = STARTING, devices, self.clock()
        status.attempts += 1
        status.error = status.exit_codes = status.finished_at_ms = None
        status.pid = status.pgid = status.pid_start = status.preempted_at_ms = None
        status.boot_id = processes.boot_id()
        # Each replica its own numbers (they share the machine); replica 0's are the ones served.
        names = job.record.port_names
        status.ports = (
            [{name: processes.free_loopback_port() for name in names} for _ in range(job.record.replicas)]
            if names
            else None
        )
        self.store.save_status(job)
        # A run evicted back to the queue may have left results: this run hands back only its own.
        for left in job.directory.glob(result_file_name("*")):
            left.unlink(missing_ok=True)
        try:
            pid = processes.spawn_supervisor(self.state_dir, job.directory.name)
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            self._finish(job, FAILED, error=f"Could not start the job's supervisor: {error}")
            return
        status.state, status.pid, status.pgid = RUNNING, pid, pid
        status.pid_start, status.started_at_ms = processes.start_time(pid), self.clock()
        self.store.save_status(job)


__all__ = ["KILL_GRACE_SECONDS", "ProcessBackend", "job_directory_name"]

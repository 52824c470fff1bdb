"""A process-backend job's files, translated into the report every backend gives (``JobReport``)."""

from __future__ import annotations

from iris_airflow_provider.backends.base import JobReport, ReplicaReport
from iris_airflow_provider.backends.process.state import (
    FAILED,
    KILLED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    Job,
    read_result,
)
from iris_airflow_provider.core.states import JobState

JOB_STATES = {
    QUEUED: JobState.PENDING,
    STARTING: JobState.ACCEPTED,
    RUNNING: JobState.RUNNING,
    SUCCEEDED: JobState.SUCCEEDED,
    FAILED: JobState.FAILED,
    KILLED: JobState.KILLED,
}


def job_report(job: Job, backend_id: str) -> JobReport:
    """The job's state, error, exit code (the first failing replica's), per-replica states and, once
    it succeeded, its result."""
    status = job.status
    state = JOB_STATES[job.state]
    codes = status.exit_codes or []
    replicas = tuple(ReplicaReport(i, _replica_state(state, code), code) for i, code in enumerate(codes)) or tuple(
        ReplicaReport(i, state) for i in range(job.record.replicas)
    )
    failing = [c for c in codes if c is not None and c != 0]
    first = status.failed_replica
    first_code = codes[first] if first is not None and 0 <= first < len(codes) else None
    if first_code is not None and first_code != 0:
        failing.insert(0, first_code)  # the replica that failed first, not one stopped because of it
    return JobReport(
        job_id=job.record.job_id,
        nonce=job.record.nonce,
        state=state,
        backend_id=backend_id,
        error=status.error or "",
        exit_code=failing[0] if failing else (0 if state is JobState.SUCCEEDED else None),
        started_at_ms=status.started_at_ms,
        finished_at_ms=status.finished_at_ms,
        replicas=replicas,
        result=read_result(job.directory) if state is JobState.SUCCEEDED else None,
    )


def _replica_state(job_state: JobState, code: int | None) -> JobState:
    if code is None:
        return job_state
    return JobState.SUCCEEDED if code == 0 else JobState.FAILED

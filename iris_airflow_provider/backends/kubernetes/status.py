"""Kubernetes Job and pod status, translated into the report every backend gives (``JobReport``).

- suspended, or a pod still behind Kueue's admission gate -> pending (awaiting acceptance);
- admitted -> accepted; a pod running (or done) -> running;
- ``Complete`` -> succeeded; ``Failed`` -> failed, with the reason and the exit code of the replica
  that failed first (the others may have been stopped because of it);
- being deleted -> killed.

Pure: the inputs are ``kubernetes`` client model objects; nothing is read from the API here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from iris_airflow_provider.backends.base import JobReport, ReplicaReport
from iris_airflow_provider.backends.kubernetes.bundle_fetch import EXIT_MEANINGS as FETCH_EXIT_MEANINGS
from iris_airflow_provider.backends.kubernetes.capacity import KUEUE_ADMISSION_GATE
from iris_airflow_provider.backends.kubernetes.names import (
    BUNDLE_CONTAINER,
    COMPLETION_INDEX,
    CONTAINER,
    JOB_ID_ANNOTATION,
    NONCE_ANNOTATION,
)
from iris_airflow_provider.core.states import JobState


def job_report(job: Any, pods: Sequence[Any], backend_id: str) -> JobReport:
    """The seed's view of one Job and its pods."""
    annotations = job.metadata.annotations or {}
    status = job.status
    conditions = {c.type: c for c in ((status.conditions if status else None) or ()) if c.status == "True"}
    replicas = int(job.spec.completions or job.spec.parallelism or 1)
    latest = latest_pod_per_index(pods)
    codes = {index: exit_code_of(pod) for index, pod in latest.items()}
    error = ""
    exit_code: int | None = None
    finished_at = None
    if "Complete" in conditions:
        state, exit_code = JobState.SUCCEEDED, 0
        finished_at = (status.completion_time if status else None) or conditions["Complete"].last_transition_time
    elif "Failed" in conditions:
        state = JobState.FAILED
        failed = conditions["Failed"]
        finished_at = failed.last_transition_time
        culprit = first_failed(latest)
        parts = []
        if culprit is not None:
            index, pod = culprit
            exit_code = codes.get(index)
            reason = terminated(pod).reason if terminated(pod) is not None else None
            shown = f" ({reason})" if reason and reason not in ("Error", "Completed") else ""
            stopped = init_failure(pod)
            if stopped is not None and exit_code is None:  # it never ran: say what stopped it
                name, code = stopped
                meaning = (
                    f": {FETCH_EXIT_MEANINGS[code]}" if name == BUNDLE_CONTAINER and code in FETCH_EXIT_MEANINGS else ""
                )
                parts.append(
                    f"Replica {index} did not start: its init container {name} exited with code {code}{meaning}"
                )
            else:
                parts.append(f"Replica {index} exited with code {exit_code}{shown}")
        parts.append(f"Job failed: {failed.reason or 'Failed'}" + (f": {failed.message}" if failed.message else ""))
        error = "; ".join(parts)
    elif job.metadata.deletion_timestamp is not None:
        state, error = JobState.KILLED, "Cancelled: the Job is being deleted"
    elif job.spec.suspend or any(gated(pod) for pod in pods):
        state = JobState.PENDING  # waiting for Kueue to admit it
    elif any((pod.status.phase if pod.status else None) in ("Running", "Succeeded", "Failed") for pod in pods):
        state = JobState.RUNNING
    else:
        state = JobState.ACCEPTED  # admitted; its pods are being created or scheduled
    reports = []
    for index in range(replicas):
        pod = latest.get(index)
        phase = (pod.status.phase if pod is not None and pod.status else None) or ""
        replica_state = {
            "Running": JobState.RUNNING,
            "Succeeded": JobState.SUCCEEDED,
            "Failed": JobState.FAILED,
        }.get(phase, state if pod is None or state.terminal else JobState.ACCEPTED)
        reports.append(ReplicaReport(index, replica_state, codes.get(index)))
    return JobReport(
        job_id=annotations.get(JOB_ID_ANNOTATION, ""),
        nonce=annotations.get(NONCE_ANNOTATION, ""),
        state=state,
        backend_id=backend_id,
        error=error,
        exit_code=exit_code,
        started_at_ms=ms(status.start_time if status else None),
        finished_at_ms=ms(finished_at),
        replicas=tuple(reports),
    )


def finished(job: Any) -> bool:
    """Whether the Job has ended (``Complete`` or ``Failed``)."""
    conditions = (job.status.conditions if job.status else None) or ()
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


def gated(pod: Any) -> bool:
    return any(gate.name == KUEUE_ADMISSION_GATE for gate in (pod.spec.scheduling_gates or ()))


def pod_index(pod: Any) -> int:
    """The pod's replica index (its Indexed Job completion index)."""
    annotations = pod.metadata.annotations or {}
    labels = pod.metadata.labels or {}
    raw = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX) or "0"
    try:
        return int(raw)
    except ValueError:
        return 0


def latest_pod_per_index(pods: Sequence[Any]) -> dict[int, Any]:
    latest: dict[int, Any] = {}
    for pod in sorted(pods, key=lambda p: ms(p.metadata.creation_timestamp) or 0):
        latest[pod_index(pod)] = pod
    return latest


def terminated(pod: Any) -> Any:
    """The job container's terminated state, or None while it has not ended."""
    for status in (pod.status.container_statuses if pod.status else None) or ():
        if status.name == CONTAINER and status.state is not None and status.state.terminated is not None:
            return status.state.terminated
    return None


def init_failure(pod: Any) -> tuple[str, int] | None:
    """The init container that ended the pod before its job container ran (name, exit code), if any."""
    for status in (pod.status.init_container_statuses if pod.status else None) or ():
        ended = status.state.terminated if status.state is not None else None
        if ended is not None and ended.exit_code:
            return status.name, int(ended.exit_code)
    return None


def exit_code_of(pod: Any) -> int | None:
    ended = terminated(pod)
    return int(ended.exit_code) if ended is not None else None


def first_failed(latest: Mapping[int, Any]) -> tuple[int, Any] | None:
    """The replica that failed first (the others may have been stopped because of it)."""
    failed = [
        (index, pod)
        for index, pod in latest.items()
        if (pod.status.phase if pod.status else None) == "Failed" or (exit_code_of(pod) or 0) != 0
    ]
    if not failed:
        return None
    return min(failed, key=lambda item: (ms(getattr(terminated(item[1]), "finished_at", None)) or 0, item[0]))


def ms(value: datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None

"""How a federated job reads in Airflow: the one-line description its task logs, the snapshot triggers
and sensors judge, and the task's outcome: the XCom a job that succeeded (or still runs) returns, the
exception that fails a task whose job did not (retried only when a new incarnation could help)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

from iris_airflow_provider.core.job_report import projected
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.links.job_page import job_url
from iris_airflow_provider.operators.serving_urls import current_serving_urls
from iris_airflow_provider.store.async_store import JobSnapshot
from iris_airflow_provider.store.records import JobRecord, current_incarnation, pending_reason_history
from iris_airflow_provider.triggers.federation import describe

if TYPE_CHECKING:
    from iris_airflow_provider.store.store import FederationStore


def outcome(store: FederationStore, job: JobRecord) -> dict[str, Any]:
    """The task's XCom for ``job``: where and how it ran, its pending reasons, its result. Raises for a
    job that ended other than succeeded: ``AirflowException`` for a failed one (a retry runs it again,
    as a new incarnation), ``AirflowFailException`` otherwise (retrying a cancel or a reject will not help)."""
    result = {
        "job_id": job.job_id,
        "disposition": disposition(job),
        "peer_id": job.peer_id,
        "backend_id": job.backend_id,
        "state": job.state.value,
        "exit_code": job.exit_code,
        "error": job.error,
        "pending_reasons": pending_reason_history(job.direction, current_incarnation(store.events(job.job_id))),
        "url": job_url(job.job_id),
        "result": job_result(store, job),
    }
    if job.spec.get("ports") and not job.terminal:  # a finished job serves nothing
        result["serving_urls"] = current_serving_urls(job)
    if job.state is JobState.SUCCEEDED or not job.terminal:
        return result
    message = describe_record(job)
    if job.failed_replicas:
        message += f" Failed: {job.failed_replicas}."
    if job.state is JobState.FAILED:
        raise AirflowException(message)
    raise AirflowFailException(message)


def job_result(store: FederationStore, job: JobRecord) -> Any:
    """What the job's current incarnation handed back at ``$IRIS_RESULT`` (parsed), or None: only a
    succeeded incarnation has one, and a rerun's new incarnation never shows an earlier one's."""
    if job.state is not JobState.SUCCEEDED:
        return None
    text = store.job_result(job.job_id, job.nonce)
    return None if text is None else json.loads(text)


def disposition(job: JobRecord) -> str:
    """``local`` for a job this cluster runs, ``queue`` for one the federation places on a peer."""
    return "local" if job.direction is Direction.LOCAL else "queue"


def describe_record(job: JobRecord) -> str:
    return describe(snapshot_of(job))


def snapshot_of(job: JobRecord) -> JobSnapshot:
    return projected(job, JobSnapshot, serving_reported=job.serving_urls is not None)

"""Jobs as the Federation page's API and the ``iris-federation`` CLI print them: the services' read
model plus what only Airflow knows, the DAG a job belongs to (its permissions govern the job) and
where the Airflow UI shows the task instance behind it."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID, runner_run_id
from iris_airflow_provider.services.cancel import CancelAnswer
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_views import job_details, job_row
from iris_airflow_provider.store.queries import job_dag_id
from iris_airflow_provider.store.records import JobRecord


def job_dag(job: JobRecord) -> str | None:
    """The Airflow DAG whose permissions govern ``job``: its origin's; received jobs without one
    belong to the runner DAG that runs them here."""
    return job_dag_id(job, received_dag_id=RUNNER_DAG_ID)


def task_instance_path(job: JobRecord) -> str | None:
    """Where the Airflow UI shows the task instance behind ``job``, relative to the UI's base URL."""
    if job.origin is not None:
        dag_id, run_id, task_id, map_index = job.origin.dag_id, job.origin.run_id, job.origin.task_id, None
        if job.origin.map_index is not None and job.origin.map_index >= 0:
            map_index = job.origin.map_index
    elif job.direction is Direction.RECEIVED:
        dag_id, run_id, task_id, map_index = RUNNER_DAG_ID, runner_run_id(job.job_id, job.nonce), "run", None
    else:
        return None
    path = f"dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    return f"{path}/mapped/{map_index}" if map_index is not None else path


def _with_airflow_fields(view: dict[str, Any], job: JobRecord) -> dict[str, Any]:
    """``view`` with ``dag_id`` just before its ``origin`` and ``task_instance_path`` just after it."""
    document: dict[str, Any] = {}
    for key, value in view.items():
        if key == "origin":
            document["dag_id"] = job_dag(job)
            document[key] = value
            document["task_instance_path"] = task_instance_path(job)
        else:
            document[key] = value
    return document


def job_row_document(job: JobRecord, now_ms: int) -> dict[str, Any]:
    """A job as a row of the jobs table."""
    return _with_airflow_fields(job_row(job, now_ms), job)


def job_details_document(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
    """A job with its spec, history, pending reasons and output tail, and while it runs, the serving
    URL of each of its named ports (:func:`serving_urls_of`)."""
    document = _with_airflow_fields(job_details(federation, job, now_ms), job)
    document["serving_urls"] = serving_urls_of(job)
    return document


def serving_urls_of(job: JobRecord) -> dict[str, str]:
    """Where the job serves its ports while it runs: minted now for a job this cluster runs, or as
    the peer running a job handed to it minted them (checked by the sync before it kept them)."""
    from iris_airflow_provider.operators.serving_urls import current_serving_urls  # reads Airflow's config

    try:
        return current_serving_urls(job)
    except (OSError, ValueError):  # no readable secret: the task log says why
        return {}


def cancel_document(answer: CancelAnswer, now_ms: int) -> dict[str, Any]:
    """What a cancel did: ``{"job_id", "result", "message", "job"}``."""
    job = job_row_document(answer.job, now_ms) if answer.job is not None else None
    return {"job_id": answer.job_id, "result": answer.result, "message": answer.message, "job": job}

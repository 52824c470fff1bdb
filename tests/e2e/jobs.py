"""Finding the job a DAG run's task submitted, in the end-to-end tests."""

from __future__ import annotations

from functools import partial

import httpx

from devtools.airflow_deployment import AirflowDeployment
from tests.waiting import wait_for

_wait = partial(wait_for, timeout=90, interval=0.5)


def job_of(deployment: AirflowDeployment, run_id: str, dag_id: str = "e2e_job") -> str:
    """The job a run's task submitted, read from its XCom (which must be there already)."""
    return str(deployment.xcom(dag_id, run_id, "run", key="iris_federation_job_id"))


def admitted_job_of(deployment: AirflowDeployment, run_id: str, dag_id: str = "e2e_job") -> str:
    """The job a run's task submitted, once it has been admitted (its id is then in XCom); a task
    that failed first fails the test with its log."""

    def lookup() -> str | None:
        try:
            return job_of(deployment, run_id, dag_id)
        except httpx.HTTPStatusError as error:
            if error.response.status_code != 404:
                raise
        if deployment.task_instance(dag_id, run_id, "run").get("state") in ("failed", "upstream_failed"):
            raise AssertionError(f"{run_id} failed:\n{deployment.task_log(dag_id, run_id, 'run')}")
        return None

    return str(_wait(lookup, f"the job id of {run_id}"))

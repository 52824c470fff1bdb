"""DAGs the end-to-end tests trigger through the REST API."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG

from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor

with DAG(dag_id="e2e_job", schedule=None, catchup=False, max_active_runs=16):
    IrisFederatedOperator(task_id="run", job="{{ dag_run.conf['job'] | tojson }}", poll_interval=1)

with DAG(dag_id="e2e_job_on_worker", schedule=None, catchup=False):
    # Waits on the worker (not deferred) and retries: for the worker-crash reattach test.
    IrisFederatedOperator(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        poll_interval=1,
        deferrable=False,
        retries=2,
        retry_delay=timedelta(seconds=1),
    )

with DAG(dag_id="e2e_timeout", schedule=None, catchup=False):
    IrisFederatedOperator(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        poll_interval=1,
        execution_timeout=timedelta(seconds=15),
    )

with DAG(dag_id="e2e_sensor", schedule=None, catchup=False):
    IrisFederatedJobSensor(
        task_id="wait",
        job_id="{{ dag_run.conf['job_id'] }}",
        until="completion",
        poll_interval=1,
        watch_dag_ids=["e2e_job"],
    )

with DAG(dag_id="e2e_workdir", schedule=None, catchup=False):
    # The directory next to this file travels with the job into its workdir, wherever it runs.
    IrisFederatedOperator(
        task_id="run", job="{{ dag_run.conf['job'] | tojson }}", workdir="workdir_example", poll_interval=1
    )

with DAG(dag_id="e2e_bundle", schedule=None, catchup=False):
    # A workdir the test writes (too big for inline files: it travels as a bundle).
    IrisFederatedOperator(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        workdir="{{ dag_run.conf['workdir'] }}",
        poll_interval=1,
    )

# Explicit submitters: the cluster file allows ml-platform@example.com for DAGs e2e_service_* only.
with DAG(dag_id="e2e_service_job", schedule=None, catchup=False):
    IrisFederatedOperator(
        task_id="run", job={"command": "echo as a service"}, submitter="ml-platform@example.com", poll_interval=1
    )

with DAG(dag_id="e2e_unlisted_principal", schedule=None, catchup=False):
    IrisFederatedOperator(
        task_id="run", job={"command": "echo never"}, submitter="ml-platform@example.com", poll_interval=1
    )

with DAG(dag_id="e2e_reattach_on_worker", schedule=None, catchup=False, max_active_runs=4):
    # Waits on the worker; one retry: a try whose worker dies, then the try that reconnects.
    IrisFederatedOperator(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        poll_interval=1,
        deferrable=False,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )


class DiesBeforeDeferring(IrisFederatedOperator):
    """A deferrable wait whose first try stops between recording its job and deferring, where the
    test kills its worker: the next try must reconnect and defer (test DAG only)."""

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        if context["ti"].try_number == 1:
            self.log.info("Waiting here for the test to kill this worker")
            while True:
                time.sleep(1)
        return super().poll_until_complete(external_id, context)


with DAG(dag_id="e2e_reattach_deferred", schedule=None, catchup=False, max_active_runs=4):
    DiesBeforeDeferring(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        poll_interval=1,
        deferrable=True,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

with DAG(dag_id="e2e_cancel_on_kill", schedule=None, catchup=False):
    # The job must not outlive the process waiting for it: any kill cancels it.
    IrisFederatedOperator(
        task_id="run", job="{{ dag_run.conf['job'] | tojson }}", poll_interval=1, deferrable=False, cancel_on_kill=True
    )

with DAG(dag_id="e2e_result", schedule=None, catchup=False):
    # A downstream task uses what the job handed back, as it would a KubernetesPodOperator's XCom.
    from airflow.sdk import task

    @task
    def use_result(outcome: dict[str, Any]) -> str:
        result = outcome["result"]
        if result is None:
            return "no result"
        return f"loss {result['loss']} at {result['checkpoint']}"

    use_result(IrisFederatedOperator(task_id="run", job="{{ dag_run.conf['job'] | tojson }}", poll_interval=1).output)

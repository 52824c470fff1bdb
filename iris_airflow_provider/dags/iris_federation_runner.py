"""Jobs other clusters handed to this one: one run per accepted handoff.

The peer API starts each accepted job on this cluster's backend at once (it never re-federates)
and creates its run here, whose task watches the job in the triggerer, relays its output into
the task log and ends as the job ends. The run's conf names the job and its incarnation.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from iris_airflow_provider.operators.received import IrisReceivedJobOperator
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID

with DAG(
    dag_id=RUNNER_DAG_ID,
    description="Jobs handed to this cluster by federation peers",
    schedule=None,
    catchup=False,
    max_active_runs=1024,
    max_active_tasks=1024,
    is_paused_upon_creation=False,
    tags=["iris-federation"],
    doc_md=__doc__,
):
    IrisReceivedJobOperator(
        task_id="run",
        job_id="{{ dag_run.conf['job_id'] }}",
        nonce="{{ dag_run.conf['nonce'] }}",
        poll_interval=2,
        # Retrying the task only resumes watching the same incarnation: it never starts the job twice,
        # and nothing done to the task (kill, reset, retry, clear, mark failed) ends the job.
        retries=3,
        retry_delay=timedelta(seconds=10),
    )

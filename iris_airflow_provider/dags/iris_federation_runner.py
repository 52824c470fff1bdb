"""Jobs other clusters handed to this one: one run per accepted handoff.

Each run starts its job on this cluster's backend (it never re-federates) and waits for it in
the triggerer, relaying its output into the task log. Runs are created by the peer API when a
handoff is accepted; their conf names the job and its incarnation.
"""

from __future__ import annotations

from airflow.sdk import DAG

from iris_airflow_provider.operators.received import IrisReceivedJobOperator
from iris_airflow_provider.runner import RUNNER_DAG_ID

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
        retries=0,  # the job itself is the unit of retry: a parent resubmits it as a new incarnation
    )

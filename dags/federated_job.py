"""Run one job where the federation finds room for it; trigger it through the REST API.

    curl -X POST "$AIRFLOW/api/v2/dags/federated_job/dagRuns" -H "Authorization: Bearer $TOKEN" \\
         -H 'Content-Type: application/json' -d '{"logical_date": null, "conf": {"job": {
             "command": "python train.py", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}},
             "priority_band": "interactive"}}}'

The triggering user is the job's accountable submitter. The task's XCom holds where the job ran and
how it ended; its log shows every pending reason it went through; the "Federation" link opens it
on the Federation page.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from iris_airflow_provider.operators.federated import IrisFederatedOperator

with DAG(
    dag_id="federated_job",
    schedule=None,
    catchup=False,
    tags=["iris-federation", "example"],
    params={
        "job": Param(
            {"command": "echo hello from $IRIS_JOB_ID", "resources": {"device": {"type": "cpu"}}},
            type="object",
            description="The job: command, image, resources, constraints, priority_band, target_cluster, env",
        ),
        "target_cluster": Param(
            "", type="string", description="Pin the job to this peer (empty: let placement choose)"
        ),
    },
    doc_md=__doc__,
):
    IrisFederatedOperator(
        task_id="run",
        job="{{ params.job | tojson }}",
        target_cluster="{{ params.target_cluster }}",
        poll_interval=2,
    )

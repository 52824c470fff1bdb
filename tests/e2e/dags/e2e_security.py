"""DAGs of the security suite (tests/e2e/test_security.py), which runs with the FAB auth manager.

``e2e_mallory`` is the one DAG mallory's role allows her to read, trigger and edit: it submits the
job in its run's ``conf`` and then watches a job (``conf.watch_job_id``, else its own). With
``conf.as_team`` its job is submitted as the team's service principal, ``team-svc``, as
``e2e_team`` (a DAG mallory may not touch) always does: two DAGs sharing one submitter, hence one
job id namespace.
"""

from __future__ import annotations

from airflow.sdk import DAG

from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor

TEAM_SUBMITTER = "team-svc"

with DAG(dag_id="e2e_mallory", schedule=None, catchup=False, max_active_runs=16):
    run = IrisFederatedOperator(
        task_id="run",
        job="{{ dag_run.conf['job'] | tojson }}",
        submitter="{{ '" + TEAM_SUBMITTER + "' if dag_run.conf.get('as_team') else '' }}",
        poll_interval=1,
    )
    watch = IrisFederatedJobSensor(
        task_id="watch",
        job_id="{{ dag_run.conf.get('watch_job_id') or ti.xcom_pull(task_ids='run', key='iris_federation_job_id') }}",
        poll_interval=1,
    )
    run >> watch

with DAG(dag_id="e2e_team", schedule=None, catchup=False, max_active_runs=16):
    IrisFederatedOperator(
        task_id="run", job="{{ dag_run.conf['job'] | tojson }}", submitter=TEAM_SUBMITTER, poll_interval=1
    )

"""A nightly hyperparameter sweep: one federated GPU job per learning rate, then a report.

Scheduled runs have no triggering user, so the sweep names its accountable submitter. Each mapped
task gets its own stable job id, so a retry reattaches to its job instead of starting another.
"""

from __future__ import annotations

from airflow.sdk import DAG, task

from iris_airflow_provider.operators.federated import IrisFederatedOperator

with DAG(
    dag_id="federated_sweep",
    schedule="@daily",
    catchup=False,
    tags=["iris-federation", "example"],
    doc_md=__doc__,
):
    train = IrisFederatedOperator.partial(
        task_id="train",
        submitter="ml-platform@example.com",
        retries=2,
        poll_interval=2,
    ).expand(
        job=[
            {
                "command": f"echo training with lr={lr}; sleep 3",
                "resources": {"device": {"type": "gpu", "variant": "h100", "count": 4}},
                "priority_band": "batch",
                "env": {"LEARNING_RATE": str(lr)},
            }
            for lr in (0.1, 0.03, 0.01)
        ]
    )

    @task
    def report(results: list[dict[str, object]]) -> str:
        return ", ".join(f"{r['job_id']} on {r['peer_id'] or 'this cluster'}: {r['state']}" for r in results)

    report(train.output)

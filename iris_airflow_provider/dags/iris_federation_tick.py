"""The placement DAG: one federation tick per run.

A tick refreshes the peers' heartbeats, expires queued jobs past their deadline, runs the pure
placement pass, applies its promotions by compare-and-set, delivers pending handoffs, pulls the
state of jobs in flight and re-drives cancels. It also cancels jobs whose submitting task has
failed: that is how marking a task failed cancels its job (the killed task wakes the tick), and how
a job whose task failed for good after its worker was lost is stopped. It runs on
a fixed period and, through an asset watched by ``FederationWakeTrigger``, whenever a job is
queued or cancelled or jobs are in flight, so a queued job is promoted within seconds when
capacity is free. One run at a time, no catchup.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, AssetWatcher, DeltaTriggerTimetable, task

from iris_airflow_provider.hooks.cluster_configuration import cluster_config
from iris_airflow_provider.hooks.runtime import default_conn_id
from iris_airflow_provider.triggers.wake import FederationWakeTrigger

DAG_ID = "iris_federation_tick"

_settings = cluster_config().placement
_conn_id = default_conn_id()

wake = Asset(
    name="iris_federation_wake",
    uri="iris-federation://wake",
    watchers=[
        AssetWatcher(
            name="iris_federation_wake",
            trigger=FederationWakeTrigger(conn_id=_conn_id, sync_interval=_settings.sync_interval_seconds),
        )
    ],
)

with DAG(
    dag_id=DAG_ID,
    description="Iris federation placement tick: heartbeats, expiry, placement, delivery, sync, cancels",
    schedule=AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(timedelta(seconds=_settings.tick_interval_seconds)), assets=[wake]
    ),
    max_active_runs=1,
    catchup=False,
    is_paused_upon_creation=False,
    tags=["iris-federation"],
    doc_md=__doc__,
    dagrun_timeout=timedelta(minutes=10),
):
    # No XCom: the placement DAG runs thousands of times a day; its report is in the task log.
    @task(task_id="tick", retries=0, do_xcom_push=False)
    def tick() -> None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        from iris_airflow_provider.hooks.runtime import get_federation

        def task_states(dag_id: str, run_ids: list[str], task_ids: list[str]) -> dict[str, dict[str, object]]:
            return RuntimeTaskInstance.get_task_states(dag_id=dag_id, run_ids=run_ids, task_ids=task_ids)

        get_federation(_conn_id).tick(task_states=task_states)

    tick()

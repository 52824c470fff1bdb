"""The shipped placement DAG and the example DAGs parse, and the bundle config points at them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

import iris_airflow_provider
from iris_airflow_provider.cli import main

PACKAGE_DAGS = Path(iris_airflow_provider.__file__).parent / "dags"
EXAMPLE_DAGS = Path(__file__).resolve().parents[1] / "dags"


@pytest.fixture(scope="module")
def package_dags() -> DagBag:
    return DagBag(dag_folder=str(PACKAGE_DAGS))


def test_the_placement_dag_is_one_run_at_a_time_woken_by_an_asset_and_a_period(package_dags):
    assert package_dags.import_errors == {}
    dag = package_dags.dags["iris_federation_tick"]
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert dag.is_paused_upon_creation is False
    assert [task.task_id for task in dag.tasks] == ["tick"]
    assert dag.timetable.timetable.delta.total_seconds() == 30  # the fixed period, from the cluster config
    (wake,) = dag.timetable.asset_condition.objects
    assert wake.name == "iris_federation_wake"
    assert [watcher.trigger.__class__.__name__ for watcher in wake.watchers] == ["FederationWakeTrigger"]


def test_the_example_dags_parse():
    bag = DagBag(dag_folder=str(EXAMPLE_DAGS))
    assert bag.import_errors == {}
    assert {"federated_job", "federated_sweep"} <= set(bag.dags)


def test_dag_bundle_config_points_at_the_package_dags():
    out = io.StringIO()
    assert main(["dag-bundle-config"], stdout=out) == 0
    bundles = json.loads(out.getvalue())
    assert [b["name"] for b in bundles] == ["dags-folder", "iris_federation"]
    assert Path(bundles[1]["kwargs"]["path"]) == PACKAGE_DAGS
    assert (PACKAGE_DAGS / "iris_federation_tick.py").exists()

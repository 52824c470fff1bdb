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


BUNDLES = "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"
GIT_BUNDLE = {
    "name": "team-dags",
    "classpath": "airflow.providers.git.bundles.git.GitDagBundle",
    "kwargs": {"git_conn_id": "team_git", "tracking_ref": "main", "subdir": "dags"},
}


def _bundle_config(*args: str) -> tuple[int, list[dict]]:
    out = io.StringIO()
    code = main(["dag-bundle-config", *args], stdout=out)
    return code, json.loads(out.getvalue()) if out.getvalue() else []


def test_by_default_it_adds_the_package_dags_to_airflows_default_dags_folder(monkeypatch):
    monkeypatch.delenv(BUNDLES, raising=False)
    code, bundles = _bundle_config()
    assert code == 0
    assert [b["name"] for b in bundles] == ["dags-folder", "iris_federation"]
    assert Path(bundles[1]["kwargs"]["path"]) == PACKAGE_DAGS
    assert (PACKAGE_DAGS / "iris_federation_tick.py").exists()


def test_it_keeps_the_bundles_already_configured_and_running_it_again_changes_nothing(monkeypatch):
    dags_folder = {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}
    monkeypatch.setenv(BUNDLES, json.dumps([GIT_BUNDLE, dags_folder]))
    code, merged = _bundle_config()
    assert code == 0
    assert merged[:2] == [GIT_BUNDLE, dags_folder]
    assert [b["name"] for b in merged] == ["team-dags", "dags-folder", "iris_federation"]
    monkeypatch.setenv(BUNDLES, json.dumps(merged))  # exported as the README says, then run again
    assert _bundle_config() == (0, merged)


def test_an_earlier_provider_bundle_is_replaced_in_place_of_being_doubled(monkeypatch):
    stale = {"name": "iris_federation", "classpath": "x.Y", "kwargs": {"path": "/old/site-packages/dags"}}
    monkeypatch.setenv(BUNDLES, json.dumps([stale, GIT_BUNDLE]))
    _, merged = _bundle_config()
    assert [b["name"] for b in merged] == ["team-dags", "iris_federation"]
    assert Path(merged[1]["kwargs"]["path"]) == PACKAGE_DAGS


def test_provider_bundle_only_prints_the_package_bundle_alone(monkeypatch):
    monkeypatch.setenv(BUNDLES, json.dumps([GIT_BUNDLE]))
    code, bundles = _bundle_config("--provider-bundle-only")
    assert code == 0 and [b["name"] for b in bundles] == ["iris_federation"]


@pytest.mark.parametrize("value", ["{not json", json.dumps({"name": "team-dags"})])
def test_a_current_value_that_is_not_a_list_of_bundles_is_refused_naming_the_option(monkeypatch, capsys, value):
    monkeypatch.setenv(BUNDLES, value)
    code, bundles = _bundle_config()
    assert (code, bundles) == (2, [])
    assert "[dag_processor] dag_bundle_config_list" in capsys.readouterr().err


def test_airflow_accepts_the_merged_list(monkeypatch, tmp_path):
    """Airflow's own bundle manager loads what the command prints (Local bundles: the git provider is not installed)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    team = {"name": "team-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}
    team["kwargs"] = {"path": str(tmp_path)}
    monkeypatch.setenv(BUNDLES, json.dumps([team]))
    _, merged = _bundle_config()
    monkeypatch.setenv(BUNDLES, json.dumps(merged))
    names = {bundle.name for bundle in DagBundlesManager().get_all_dag_bundles()}
    assert names == {"team-dags", "iris_federation"}

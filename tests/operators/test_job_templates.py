"""The job as a template: a job file beside the DAG (``template_ext``), rendered by Jinja then parsed, and a
templated job rendered to native objects whatever the DAG's ``render_template_as_native_obj``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import DAG

from iris_airflow_provider.links.job_page import FederationJobLink, job_url
from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.operators.received import IrisReceivedJobOperator
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor
from iris_airflow_provider.store.store import FederationStore

DAG_FILE = """
from airflow.sdk import DAG
from iris_airflow_provider.links.job_page import FederationJobLink, job_url
from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.operators.received import IrisReceivedJobOperator
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor

with DAG("templated_job", schedule=None, params={"greeting": "hello", "steps": 3}):
    train = IrisFederatedOperator(task_id="train", job="jobs/train.yaml", conn_id="iris_templates", wait_for="none")
    watch = IrisFederatedJobSensor(
        task_id="watch",
        job_id="{{ ti.xcom_pull(task_ids='train', key='iris_federation_job_id') }}",
        until="running",
        conn_id="iris_templates",
        deferrable=False,
        poke_interval=0.2,
    )
    train >> watch
"""

JOB_FILE = """
# a job file beside the DAG: Jinja first, then YAML
command: ["sh", "-c", "echo {{ params.greeting }} from $RUN_ID", "--config", "conf.yaml"]
env:
  RUN_ID: "{{ run_id }}"
  STEPS: "{{ params.steps * 2 }}"
"""


@pytest.fixture(scope="module")
def airflow_metadata() -> None:
    from airflow.utils.db import resetdb

    resetdb()


def test_a_yaml_job_file_beside_the_dag_is_rendered_and_run_by_a_real_dag_run_and_both_tasks_link_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_metadata: None
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    store_url = f"sqlite:///{tmp_path / 'federation.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_IRIS_TEMPLATES", json.dumps({"conn_type": "irisfederation", "host": store_url}))
    dags = tmp_path / "dags"
    bundle = {"name": "templates", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}
    bundles = json.dumps([{**bundle, "kwargs": {"path": str(dags)}}])
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", bundles)  # dag.test() runs it from there
    (dags / "jobs").mkdir(parents=True)
    (dags / "templated_job.py").write_text(DAG_FILE)
    (dags / "jobs" / "train.yaml").write_text(JOB_FILE)
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    dag = bag.get_dag("templated_job")

    run = dag.test()

    assert run.state == "success"
    store = FederationStore.from_url(store_url)
    try:
        job = _only_job(store)
        assert job.origin is not None and job.origin.run_id == run.run_id
        assert job.spec["command"] == ["sh", "-c", "echo hello from $RUN_ID", "--config", "conf.yaml"]
        assert job.spec["env"] == {"RUN_ID": run.run_id, "STEPS": "6"}
    finally:
        store.dispose()
    # The UI's "Federation" button, as the API server resolves it, on the operator and on the sensor.
    assert extra_links(run.run_id, "train") == {"Federation": job_url(job.job_id)}
    assert extra_links(run.run_id, "watch") == {"Federation": job_url(job.job_id)}


def extra_links(run_id: str, task_id: str) -> dict[str, str | None]:
    from airflow.api_fastapi.common.dagbag import create_dag_bag
    from airflow.api_fastapi.core_api.routes.public.extra_links import get_extra_links
    from airflow.utils.session import create_session

    with create_session() as session:
        links = get_extra_links("templated_job", run_id, task_id, session=session, dag_bag=create_dag_bag())
    return dict(links.extra_links)


def _only_job(store: FederationStore) -> Any:
    from iris_airflow_provider.store.queries import JobFilter, MonitoringQueries

    (job,) = MonitoringQueries(store).list_jobs(JobFilter(), limit=10, offset=0).jobs
    return job


def rendered(job: Any, *, native_dag: bool = False, **kwargs: Any) -> IrisFederatedOperator:
    with DAG("train", schedule=None, render_template_as_native_obj=native_dag):
        task = IrisFederatedOperator(task_id="fit", job=job, **kwargs)
    params = {"job": {"command": ["python", "train.py", "--config", "conf.yaml"], "resources": {"replicas": 2}}}
    task.render_template_fields({"params": {**params, "peer": "cw-h100", "n": 4}, "run_id": "manual__1"})  # type: ignore[arg-type]
    return task


@pytest.mark.parametrize("native_dag", [False, True])
def test_a_templated_job_renders_to_the_object_itself_not_its_repr(native_dag: bool) -> None:
    task = rendered("{{ params.job }}", native_dag=native_dag, target_cluster="{{ params.peer }}")
    assert task.job == {"command": ["python", "train.py", "--config", "conf.yaml"], "resources": {"replicas": 2}}
    assert task.target_cluster == "cw-h100"


def test_strings_inside_a_job_are_text_templates_never_job_files() -> None:
    job = {"job_id": "fit", "command": ["python", "train.py", "--config", "conf.yaml"], "env": {"N": "{{ params.n }}"}}
    task = rendered(job)
    assert task.job == {**job, "env": {"N": "4"}}
    assert task.job_spec({"ti": None, "dag_run": None}).env == {"N": "4"}  # type: ignore[arg-type]


def test_json_and_yaml_text_are_parsed_and_anything_else_fails_naming_the_field(tmp_path: Path) -> None:
    context = {"ti": None, "dag_run": None}
    yaml_job = IrisFederatedOperator(task_id="a", job="command: [echo, hi]\njob_id: from-yaml")
    assert yaml_job.job_spec(context).command == ("echo", "hi")  # type: ignore[arg-type]
    json_job = IrisFederatedOperator(task_id="b", job='{"command": "true", "job_id": "from-json"}')
    assert json_job.job_spec(context).job_id == "/airflow/from-json"  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match=r"job: not valid JSON or YAML"):
        IrisFederatedOperator(task_id="c", job="command: [unclosed").job_spec(context)  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match=r"job: expected an object .* got list"):
        IrisFederatedOperator(task_id="d", job="[1, 2]").job_spec(context)  # type: ignore[arg-type]


def test_a_missing_job_file_fails_naming_it_and_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(AirflowFailException, match=r"job: no job file 'jobs/missing.yaml' beside the DAG"):
        rendered("jobs/missing.yaml")


@pytest.mark.parametrize("task_class", [IrisFederatedOperator, IrisFederatedJobSensor, IrisReceivedJobOperator])
def test_every_task_links_to_its_job_and_has_its_own_colours(task_class: type) -> None:
    assert [type(link) for link in task_class.operator_extra_links] == [FederationJobLink]
    assert task_class.ui_color.startswith("#")


def test_the_watching_and_mirroring_tasks_stand_apart_from_the_submitting_one() -> None:
    colours = {
        (c.ui_color, c.ui_fgcolor) for c in (IrisFederatedOperator, IrisFederatedJobSensor, IrisReceivedJobOperator)
    }
    assert len(colours) == 3

"""What IrisFederatedOperator submits: the rendered job, its derived id and its workdir files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import DAG

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.limits import MAX_FILES_BYTES
from iris_airflow_provider.operators import federated
from iris_airflow_provider.operators.federated import IrisFederatedOperator


def operator(tmp_path: Path, **kwargs: Any) -> tuple[IrisFederatedOperator, dict[str, Any]]:
    with DAG(dag_id="train", schedule=None) as dag:
        task = IrisFederatedOperator(task_id="fit", **kwargs)
    dag.fileloc = str(tmp_path / "dags" / "train.py")  # where the DAG file lives
    context = {
        "ti": SimpleNamespace(dag_id="train", task_id="fit", run_id="manual__1", map_index=2),
        "dag_run": SimpleNamespace(triggering_user_name="alice@example.com"),
        "dag": dag,
    }
    return task, context


def test_the_job_id_is_derived_from_the_task_instance_and_its_submitter(tmp_path: Path) -> None:
    task, context = operator(tmp_path, job={"command": "true"})
    assert task.job_spec(context).job_id == "/alice@example.com/train.fit.manual__1.2"


def test_a_derived_job_id_always_meets_the_job_id_rule(tmp_path: Path) -> None:
    task, context = operator(tmp_path, job={"command": "true"})
    context["dag_run"] = SimpleNamespace(triggering_user_name="Zoë O'Brien\x00")
    context["ti"] = SimpleNamespace(
        dag_id="etl.", task_id=".load", run_id="manual__2026-01-01T00:00:00+00:00", map_index=-1
    )
    job_id = task.job_spec(context).job_id
    assert job_id == "/Zo_O_Brien_/etl.load.manual__2026-01-01T00:00:00+00:00"  # no '..': Airflow refuses it in run ids


def test_a_workdir_beside_the_dag_file_travels_and_the_jobs_own_files_win(tmp_path: Path) -> None:
    code = tmp_path / "dags" / "code"
    code.mkdir(parents=True)
    (code / "run.sh").write_text("echo from the workdir\n")
    (code / "params.txt").write_text("lr=0.1\n")
    task, context = operator(
        tmp_path, job={"command": "sh run.sh", "files": {"params.txt": "lr=0.2\n"}}, workdir="code"
    )
    assert task.job_spec(context).files == {"params.txt": "lr=0.2\n", "run.sh": "echo from the workdir\n"}


def test_a_workdir_over_the_inline_limits_travels_as_one_bundle_with_the_jobs_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "dags" / "code"
    code.mkdir(parents=True)
    (code / "run.sh").write_text("echo from the workdir\n")
    (code / "params.txt").write_text("lr=0.1\n")
    (code / "weights.bin").write_bytes(b"\x01" * (MAX_FILES_BYTES + 1))  # one byte too many for files
    store = BundleStore(tmp_path / "bundles")
    monkeypatch.setattr(federated, "get_bundle_store", lambda conn_id=None: store)
    task, context = operator(
        tmp_path, job={"command": "sh run.sh", "files": {"params.txt": "lr=0.2\n"}}, workdir="code"
    )
    spec = task.job_spec(context)
    assert spec.files == {} and spec.bundle is not None and store.has(spec.bundle)
    assert task.job_spec(context).bundle == spec.bundle  # packed again (a retry): the same bundle
    workdir = tmp_path / "unpacked"
    workdir.mkdir()
    store.unpack(spec.bundle, workdir)
    assert (workdir / "params.txt").read_text() == "lr=0.2\n"  # the job's own files win
    assert (workdir / "weights.bin").stat().st_size == MAX_FILES_BYTES + 1

    # A bundle named by hand must be one this cluster holds.
    task, context = operator(tmp_path, job={"command": "true", "bundle": {"digest": "sha256:" + "0" * 64, "size": 9}})
    with pytest.raises(AirflowFailException, match=r"job\.bundle: sha256:0{64} \(9 bytes\) is not in this cluster"):
        task.job_spec(context)
    task, context = operator(tmp_path, job={"command": "true", "bundle": spec.bundle.model_dump()})
    assert task.job_spec(context).bundle == spec.bundle

    # A bad job fails before its workdir is packed.
    task, context = operator(tmp_path, job={"command": "true", "priority_band": "urgent"}, workdir="code")
    with pytest.raises(AirflowFailException, match=r"job\.priority_band"):
        task.job_spec(context)
    assert len(list((tmp_path / "bundles" / "sha256").iterdir())) == 1


def test_a_workdir_that_cannot_travel_fails_the_task_naming_it(tmp_path: Path) -> None:
    task, context = operator(tmp_path, job={"command": "true"}, workdir="nowhere")
    with pytest.raises(AirflowFailException) as caught:
        task.job_spec(context)
    # Relative to the DAG file's folder, and said so.
    assert str(caught.value) == f"Invalid job:\nworkdir: '{tmp_path / 'dags' / 'nowhere'}' is not a directory"


def test_a_bad_field_fails_the_task_naming_the_field_and_the_accepted_values(tmp_path: Path) -> None:
    task, context = operator(tmp_path, job={"command": "true", "priority_band": "urgent"})
    with pytest.raises(AirflowFailException, match=r"job\.priority_band") as caught:
        task.job_spec(context)
    assert "production" in str(caught.value) and "batch" in str(caught.value)


def test_a_bare_job_id_goes_under_the_submitters_namespace(tmp_path: Path) -> None:
    task, context = operator(tmp_path, job={"job_id": "nightly-eval", "command": "true"})
    assert task.job_spec(context).job_id == "/alice@example.com/nightly-eval"
    task, context = operator(tmp_path, job={"job_id": "/alice@example.com/nightly-eval", "command": "true"})
    assert task.job_spec(context).job_id == "/alice@example.com/nightly-eval"


@pytest.mark.parametrize("job_id", ["/bob/train", "/alice/train", "/airflow/train"])
def test_a_job_id_in_another_users_namespace_fails_the_task_before_anything_is_written(
    tmp_path: Path, job_id: str
) -> None:
    task, context = operator(tmp_path, job={"job_id": job_id, "command": "true"})
    with pytest.raises(AirflowFailException) as caught:
        task.job_spec(context)
    assert f"job_id {job_id!r} is outside the submitter's namespace" in str(caught.value)
    assert "/alice@example.com/<name>" in str(caught.value)


def test_workdir_files_that_collide_with_the_jobs_own_fail_the_task_before_anything_is_written(tmp_path: Path) -> None:
    code = tmp_path / "dags" / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "train.csv").write_text("1,2\n")
    task, context = operator(
        tmp_path, job={"command": "true", "files": {"data": "a file, not a directory"}}, workdir="code"
    )
    with pytest.raises(AirflowFailException) as caught:
        task.job_spec(context)
    assert str(caught.value) == "Invalid job:\njob.files: 'data' is a file and a directory of 'data/train.csv'"

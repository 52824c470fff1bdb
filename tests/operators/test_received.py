"""The peer's runner task mirrors a received job; nothing done to the task ends the job.

A real receiving cluster (SQLite store, process backend): the handed-off job runs, its runner
task is killed, reset and retried (each try a new operator, as Airflow runs them), and the job
runs on, watched again by the next try, until it ends by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from iris_airflow_provider.core.orphans import KillAction
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.links.job_page import JOB_ID_XCOM_KEY, FederationJobLink, job_url
from iris_airflow_provider.operators import received
from iris_airflow_provider.operators.received import IrisReceivedJobOperator
from iris_airflow_provider.store.store import FederationStore
from tests.receiving_peer import Peer, stop_all_jobs
from tests.store.conftest import sqlite_store

__all__ = ["sqlite_store"]

KEY = "marin:/alice/train"


@pytest.fixture
def peer(tmp_path: Path, sqlite_store: FederationStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    peer = Peer(tmp_path, sqlite_store)
    monkeypatch.setattr(received, "get_federation", lambda conn_id=None: peer.federation)
    yield peer
    stop_all_jobs(peer)


class TaskInstance:
    """What the runner task asks of its task instance: somewhere to push XCom."""

    def __init__(self) -> None:
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.xcom[key] = value


def runner_try() -> IrisReceivedJobOperator:
    with DAG(dag_id="iris_federation_runner", schedule=None):
        return IrisReceivedJobOperator(task_id="run", job_id=KEY, nonce="n1", poll_interval=0.05)


def test_killing_resetting_and_retrying_the_runner_task_never_ends_the_job(peer: Peer) -> None:
    gate = peer.store.engine.url.database + ".go"  # type: ignore[operator]
    spec = {
        "command": f"while [ ! -e {gate} ]; do sleep 0.02; done; echo trained",
        "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}},
    }
    peer.handoff(spec=spec)
    for _ in range(3):  # a kill, an orphaned-task reset, a retry: each ends the try with on_kill()
        task, ti = runner_try(), TaskInstance()
        with pytest.raises(TaskDeferred) as deferred:
            task.execute({"ti": ti})  # type: ignore[arg-type]
        # The task's Federation link opens the job, while it waits too.
        assert ti.xcom == {JOB_ID_XCOM_KEY: KEY, FederationJobLink().xcom_key: job_url(KEY)}
        assert deferred.value.trigger.kill_action is KillAction.IGNORE  # its trigger leaves the job alone too
        task.on_kill()
        job = peer.store.get_job(KEY)
        assert job is not None and not job.terminal and job.cancel_intent_version == 0
    Path(gate).touch()
    assert peer.wait_until_finished().state is JobState.SUCCEEDED
    last = runner_try()
    result = last.execute({"ti": TaskInstance()})  # type: ignore[arg-type]
    assert result == {"job_id": KEY, "requester": "marin", "state": "succeeded", "exit_code": 0}

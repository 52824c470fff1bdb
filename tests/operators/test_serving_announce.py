"""The operator's task announces the serving URLs of a job it handed to a peer (minted there, kept by
the parent once checked) when they arrive: it pushes them to XCom once per incarnation, woken by its
trigger while deferred (and deferring again, never resubmitting), or as it polls on the worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.federation import Federation
from tests.operators.test_resume import TaskStateStore, Try, waits
from tests.services.world import World, event_kinds

URLS = {"http": "https://marin.example.com/proxy/t/cluster=cw-h100/eyJ.eyJ.sig/http/"}
JOB = {"command": "echo served", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
SERVED = {**JOB, "ports": [{"name": "http"}]}


def now() -> int:
    return int(time.time() * 1000)


def runs_on_the_peer(world: World, job_id: str, urls: dict[str, str] | None) -> str:
    """The job handed to cw-h100 and reported running there (with ``urls``); its nonce."""
    job = world.job(job_id)
    assert world.store.promote(Promotion(job_id, "cw-h100", "default", False, {"h100": 1}, None), now())
    assert world.store.mark_handed_off(job_id, job.nonce, now(), peer_id="cw-h100")
    assert world.store.mirror(JobReport(job_id, job.nonce, JobState.RUNNING, "default", serving_urls=urls), now())
    return job.nonce


def pushes_of(attempt: Try) -> list[tuple[str, Any]]:
    pushed: list[tuple[str, Any]] = []
    attempt.context["ti"].xcom_push = lambda key, value: pushed.append((key, value))
    return pushed


def served(pushed: list[tuple[str, Any]]) -> list[Any]:
    return [value for key, value in pushed if key == "serving_urls"]


def test_a_deferred_task_is_woken_to_announce_them_and_waits_again(world: World, federation: Federation) -> None:
    state_store = TaskStateStore()
    first = Try("manual__1", 1, state_store, job=SERVED, deferrable=True)
    pushed = pushes_of(first)
    with pytest.raises(TaskDeferred) as deferred:
        first.execute()
    trigger = deferred.value.trigger
    assert (trigger.announce_serving, trigger.serving_announced, trigger.log_after_seq) == (True, "", 0)
    assert served(pushed) == []  # handed to a peer: nothing to announce until it runs there
    job_id = first.operator.job_id
    assert job_id is not None
    nonce = runs_on_the_peer(world, job_id, URLS)

    # The worker resuming the task on the trigger's event: a fresh operator, the same try.
    event = {"status": "serving", "job_id": job_id, "nonce": nonce, "announced": "", "log_seq": 7}
    resumed = Try("manual__1", 1, state_store, job=SERVED, deferrable=True)
    pushed = pushes_of(resumed)
    with pytest.raises(TaskDeferred) as again:
        resumed.operator.execute_complete(resumed.context, event)
    assert served(pushed) == [URLS]
    trigger = again.value.trigger
    assert (trigger.serving_announced, trigger.log_after_seq, trigger.job_id) == (nonce, 7, job_id)
    assert again.value.method_name == "execute_complete"
    assert event_kinds(world.store, job_id).count("admitted") == 1  # waited on, never resubmitted

    # A wake for an incarnation already announced (as an earlier resumption said) pushes nothing more.
    stale = Try("manual__1", 1, state_store, job=SERVED, deferrable=True)
    pushed = pushes_of(stale)
    with pytest.raises(TaskDeferred) as once_more:
        stale.operator.execute_complete(stale.context, {**event, "announced": nonce})
    assert served(pushed) == [] and once_more.value.trigger.serving_announced == nonce

    # While it runs, its return value has them too (as a local job's does).
    finishing = Try("manual__1", 1, state_store, job=SERVED, deferrable=True)
    assert (
        finishing.operator.execute_complete(finishing.context, {**event, "status": "reached"})["serving_urls"] == URLS
    )


def test_a_wake_that_finds_the_job_over_ends_the_task(world: World, federation: Federation) -> None:
    first = Try("manual__1", 1, TaskStateStore(), job=SERVED, deferrable=True)
    with pytest.raises(TaskDeferred):
        first.execute()
    job_id = first.operator.job_id
    assert job_id is not None
    nonce = runs_on_the_peer(world, job_id, URLS)
    assert world.store.mirror(JobReport(job_id, nonce, JobState.SUCCEEDED, "default", exit_code=0), now())
    event = {"status": "serving", "job_id": job_id, "nonce": nonce, "announced": "", "log_seq": 0}
    resumed = Try("manual__1", 1, TaskStateStore(), job=SERVED, deferrable=True)
    result = resumed.operator.execute_complete(resumed.context, event)
    assert result["state"] == "succeeded" and "serving_urls" not in result


def test_a_task_waiting_on_the_worker_announces_them_once(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = Try("manual__1", 1, TaskStateStore(), job=SERVED, deferrable=False)
    pushed = pushes_of(attempt)
    polls = [0]

    def the_peer_runs_it() -> None:
        polls[0] += 1
        job_id = attempt.operator.job_id
        assert job_id is not None
        if polls[0] == 1:
            runs_on_the_peer(world, job_id, URLS)
        elif polls[0] == 5:
            job = world.job(job_id)
            world.store.mirror(JobReport(job_id, job.nonce, JobState.SUCCEEDED, "default", exit_code=0), now())

    waits(monkeypatch, the_peer_runs_it)
    result = attempt.execute()
    assert result["state"] == "succeeded"
    assert served(pushed) == [URLS]

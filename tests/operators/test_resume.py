"""A try that reconnects to its job ends exactly as a first run would, and what a kill does.

``IrisFederatedOperator`` runs in process against a real federation (SQLite store, process
backends): a first try submits a job and is "killed" in its wait (the worker dies), a second try
with a fresh task instance and the same task state store reconnects to it, and both end, for every
``wait_for``, on the worker and deferred, exactly as an uninterrupted run of the same job does.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowTaskTimeout, TaskDeferred

from iris_airflow_provider.core.orphans import TASK_KILLED, KillAction
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.operators import federated
from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.operators.job_outcome import snapshot_of
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.store import FederationStore
from iris_airflow_provider.triggers.federation import reached
from tests.services.world import World, event_kinds

_real_sleep = time.sleep
WAIT_FOR = ("completion", "acceptance", "none")


class WorkerDied(BaseException):
    """The worker process going away mid-wait: nothing after it runs in that try."""


class TaskStateStore:
    """Airflow 3.3's task state store, as the task runner hands it in ``context``: kept across tries."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


class Try:
    """One try of the task: its own task instance (XCom starts empty), the run's task state store."""

    def __init__(self, run_id: str, number: int, state_store: TaskStateStore, **kwargs: Any) -> None:
        with DAG(dag_id="train", schedule=None):
            self.operator = IrisFederatedOperator(task_id="fit", poll_interval=0.01, **kwargs)
        self.xcom: dict[str, Any] = {}
        ti = SimpleNamespace(
            dag_id="train",
            task_id="fit",
            run_id=run_id,
            map_index=-1,
            try_number=number,
            start_date=None,
            stats_tags={},
            xcom_push=lambda key, value: self.xcom.__setitem__(key, value),
        )
        self.context: dict[str, Any] = {
            "ti": ti,
            "dag_run": SimpleNamespace(triggering_user_name="alice"),
            "task_state_store": state_store,
        }

    def execute(self) -> Any:
        return self.operator.execute(self.context)

    def resume(self, deferred: TaskDeferred, store: FederationStore) -> Any:
        """What the triggerer and the next worker do: wait until the job got as far as the trigger
        waits for (``federated.time.sleep`` moves it on, as in a wait on the worker), then resume."""
        trigger = deferred.trigger
        assert trigger.kill_action is KillAction.CHECK
        assert trigger.job_id == self.operator.job_id
        while not reached(snapshot_of(store.get_job(trigger.job_id)), trigger.until):
            federated.time.sleep(0)
        event = {"status": "reached", "job_id": trigger.job_id}
        return getattr(self.operator, deferred.method_name)(self.context, event)


def waits(monkeypatch: pytest.MonkeyPatch, each: Any) -> None:
    """Each time the operator waits on the worker, ``each()`` runs (the tick, a release, a death)."""
    calls = [0]

    def sleep(_seconds: float) -> None:
        calls[0] += 1
        assert calls[0] < 2000, "the wait never ended"
        each()
        _real_sleep(0.01)

    monkeypatch.setattr(federated, "time", SimpleNamespace(time=time.time, sleep=sleep))


def outcome(run: Any) -> tuple[str, Any]:
    """What a try ended with: its return value, or the exception the task fails with."""
    try:
        return "returned", run()
    except TaskDeferred:
        raise
    except (AirflowFailException, AirflowException) as error:
        return type(error).__name__, str(error)


def die_in_its_wait(monkeypatch: pytest.MonkeyPatch, attempt: Try) -> str:
    """Run ``attempt`` until its worker dies while it waits on its job; the job's id."""

    def die() -> None:
        raise WorkerDied

    waits(monkeypatch, die)
    with pytest.raises(WorkerDied):
        attempt.execute()
    job_id = attempt.operator.job_id
    assert job_id is not None
    return job_id


def run_to_the_end(attempt: Try, deferrable: bool, store: FederationStore) -> tuple[str, Any]:
    if not deferrable:
        return outcome(attempt.execute)
    try:
        return outcome(attempt.execute)
    except TaskDeferred as deferred:
        resumed = deferred
    return outcome(lambda: attempt.resume(resumed, store))


def normalised(result: tuple[str, Any], job_id: str) -> tuple[str, Any]:
    """The two runs' jobs differ by id (and so by URL): compare everything else."""
    kind, value = result
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("job_id", "url")}
    elif isinstance(value, str):
        value = value.replace(job_id, "<job>")
    return kind, value


@pytest.mark.parametrize("deferrable", [False, True], ids=["on-worker", "deferred"])
@pytest.mark.parametrize("wait_for", WAIT_FOR)
@pytest.mark.parametrize("exit_code", [0, 3], ids=["job-succeeds", "job-fails"])
def test_a_try_that_reconnects_after_its_worker_died_ends_like_a_first_run(
    world: World,
    federation: Federation,
    monkeypatch: pytest.MonkeyPatch,
    deferrable: bool,
    wait_for: str,
    exit_code: int,
) -> None:
    def job(gate: str) -> dict[str, Any]:
        return {"command": world.held(gate, before="echo started") + f"; exit {exit_code}"}

    def tick_and_release(gate: str) -> Any:
        return lambda: (world.release(gate), federation.tick())

    # An uninterrupted run: what a reconnecting try must end with.
    waits(monkeypatch, tick_and_release("first"))
    first = Try("manual__1", 1, TaskStateStore(), job=job("first"), wait_for=wait_for, deferrable=deferrable)
    expected = run_to_the_end(first, deferrable, world.store)
    if wait_for != "completion":  # it returned before the job ended: let it end before comparing
        world.release("first")

    # The same task in another run: its first try dies in its wait, the job still running.
    state_store = TaskStateStore()
    dying = Try("manual__2", 1, state_store, job=job("second"), wait_for="completion", deferrable=False)
    job_id = die_in_its_wait(monkeypatch, dying)
    assert state_store.values == {"iris_federation_job": job_id}
    assert world.job(job_id).state in (JobState.PENDING, JobState.RUNNING)

    # Its second try reconnects (the mixin finds the job active), then the job ends.
    waits(monkeypatch, tick_and_release("second"))
    retry = Try("manual__2", 2, state_store, job=job("second"), wait_for=wait_for, deferrable=deferrable)
    got = run_to_the_end(retry, deferrable, world.store)

    assert normalised(got, job_id) == normalised(expected, first.operator.job_id or "")
    assert retry.xcom.keys() == first.xcom.keys()
    assert retry.xcom["iris_federation_job_id"] == job_id and retry.xcom["disposition"] == "local"
    assert event_kinds(world.store, job_id).count("admitted") == 1  # reconnected: nothing resubmitted
    if wait_for == "completion":
        assert got[0] == ("returned" if exit_code == 0 else "AirflowException")
        if exit_code == 0:
            assert got[1]["state"] == "succeeded" and got[1]["exit_code"] == 0
        else:
            assert "exited with code 3" in got[1]
    else:
        assert got[0] == "returned" and got[1]["job_id"] == job_id  # never None, never an empty XCom


def test_a_try_that_finds_its_job_already_succeeded_returns_its_result_and_ids(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_store = TaskStateStore()
    dying = Try("manual__1", 1, state_store, job={"command": world.held("go")}, deferrable=False)

    job_id = die_in_its_wait(monkeypatch, dying)
    world.release("go")
    waits(monkeypatch, federation.tick)
    while not world.job(job_id).terminal:
        federation.tick()
        _real_sleep(0.02)
    retry = Try("manual__1", 2, state_store, job={"command": world.held("go")}, deferrable=False)
    result = retry.execute()
    assert (result["job_id"], result["state"]) == (job_id, "succeeded")
    assert retry.xcom["iris_federation_job_id"] == job_id


@pytest.mark.parametrize("deferrable", [False, True], ids=["on-worker", "deferred"])
def test_a_killed_task_leaves_its_job_running_and_asks_the_tick_to_check(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch, deferrable: bool
) -> None:
    attempt = Try("manual__1", 1, TaskStateStore(), job={"command": world.held("go")}, deferrable=deferrable)

    def killed() -> None:  # what Airflow does on SIGTERM: on_kill(), then the worker goes away
        attempt.operator.on_kill()
        raise WorkerDied

    waits(monkeypatch, killed)
    if deferrable:
        with pytest.raises(TaskDeferred):
            attempt.execute()
        attempt.operator.on_kill()  # a worker is not the one waiting, but on_kill stays safe
    else:
        with pytest.raises(WorkerDied):
            attempt.execute()
    job_id = attempt.operator.job_id
    assert job_id is not None
    job = world.job(job_id)
    assert not job.terminal and job.cancel_intent_version == 0
    assert TASK_KILLED in event_kinds(world.store, job_id)

    # The tick's check reads Airflow's state of the task: a worker going away leaves it running...
    federation.tick(task_states=lambda dag, runs, tasks: {"manual__1": {"fit": "running"}})
    assert world.job(job_id).cancel_intent_version == 0
    # ... a user marking it failed does not.
    federation.tick(task_states=lambda dag, runs, tasks: {"manual__1": {"fit": "failed"}})
    assert world.job(job_id).cancel_intent_version == 1


def test_with_cancel_on_kill_any_kill_cancels_the_job(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = Try("manual__1", 1, TaskStateStore(), job={"command": world.held("go")}, deferrable=False)
    attempt.operator.cancel_on_kill = True

    def killed() -> None:
        attempt.operator.on_kill()
        raise WorkerDied

    waits(monkeypatch, killed)
    with pytest.raises(WorkerDied):
        attempt.execute()
    job = world.job(attempt.operator.job_id or "")
    assert job.cancel_intent_version == 1 and TASK_KILLED not in event_kinds(world.store, job.job_id)


def test_an_execution_timeout_cancels_the_job_and_the_kill_that_follows_adds_nothing(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = Try("manual__1", 1, TaskStateStore(), job={"command": world.held("go")}, deferrable=False)

    def timed_out() -> None:  # Airflow's execution_timeout raises in the wait...
        raise AirflowTaskTimeout

    waits(monkeypatch, timed_out)
    with pytest.raises(AirflowTaskTimeout):
        attempt.execute()
    attempt.operator.on_kill()  # ... then calls on_kill
    job = world.job(attempt.operator.job_id or "")
    assert job.cancel_intent_version == 1 and TASK_KILLED not in event_kinds(world.store, job.job_id)

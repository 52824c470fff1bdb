"""A job hands back a result: the JSON it writes at ``$IRIS_RESULT`` reaches the task's XCom under
``result``, from a local backend and from a peer, through the real operator and federation (SQLite
store, process backends). A result that cannot be handed back fails the task saying why; a retry's
reattaching try returns the same result, and a new incarnation of the job never shows an old one.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.federation import Federation
from tests.operators.test_resume import TaskStateStore, Try, die_in_its_wait, run_to_the_end, waits
from tests.services.world import World

RESULT = {"loss": 0.125, "checkpoint": "s3://ckpt/run 1/step-100", "tags": ["a", "é"]}
WRITE_RESULT = f"echo training; printf '%s' '{json.dumps(RESULT)}' > \"$IRIS_RESULT\""


def attempt(run_id: str, state_store: TaskStateStore, job: dict[str, Any], *, number: int = 1, **kwargs: Any) -> Try:
    kwargs.setdefault("deferrable", False)
    made = Try(run_id, number, state_store, job=job, **kwargs)
    made.context["dag_run"] = SimpleNamespace(triggering_user_name="alice@example.com")  # admitted by the peers
    return made


@pytest.mark.parametrize("deferrable", [False, True], ids=["on-worker", "deferred"])
@pytest.mark.parametrize("where", ["local", "peer"])
def test_the_result_the_job_wrote_is_in_the_xcom_beside_its_fields(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch, deferrable: bool, where: str
) -> None:
    job: dict[str, Any] = {"command": WRITE_RESULT}
    if where == "peer":  # an agentless peer's process backend: the result travels in its report
        job |= {"resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}, "target_cluster": "cw-h100"}
    waits(monkeypatch, federation.tick)
    kind, xcom = run_to_the_end(
        attempt("manual__1", TaskStateStore(), job, deferrable=deferrable), deferrable, world.store
    )
    assert kind == "returned", xcom
    assert xcom["result"] == RESULT
    assert (xcom["state"], xcom["exit_code"], xcom["disposition"]) == (
        "succeeded",
        0,
        "local" if where == "local" else "queue",
    )
    assert xcom["peer_id"] == ("" if where == "local" else "cw-h100")
    assert {"job_id", "backend_id", "error", "pending_reasons", "url"} <= xcom.keys()


def test_a_job_that_writes_no_result_has_none(world: World, federation: Federation, monkeypatch) -> None:
    waits(monkeypatch, federation.tick)
    kind, xcom = run_to_the_end(attempt("manual__1", TaskStateStore(), {"command": "echo hi"}), False, world.store)
    assert kind == "returned" and xcom["result"] is None and xcom["state"] == "succeeded"


@pytest.mark.parametrize(
    ("writes", "message"),
    [
        ('printf \'{"loss": \' > "$IRIS_RESULT"', "is not valid JSON: Expecting value at line 1 column 10"),
        ('printf \'{"loss": NaN}\' > "$IRIS_RESULT"', "is not valid JSON: NaN is not a JSON number"),
        (
            "head -c 1048577 /dev/zero | tr '\\000' ' ' > \"$IRIS_RESULT\"",
            "holds 1048577 bytes; at most 1048576 bytes (1 MiB) are handed back",
        ),
    ],
    ids=["malformed", "nan", "oversize"],
)
def test_a_result_that_cannot_be_handed_back_fails_the_task_saying_why(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch, writes: str, message: str
) -> None:
    waits(monkeypatch, federation.tick)
    kind, error = run_to_the_end(attempt("manual__1", TaskStateStore(), {"command": writes}), False, world.store)
    # A job failure: the task fails and a retry runs the job again.
    assert kind == "AirflowException"
    assert "The job's result (the file at $IRIS_RESULT)" in error and message in error


def test_a_reattaching_try_returns_the_same_result_and_a_new_incarnation_never_shows_it(
    world: World, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first try dies while its job runs; the job ends with its result meanwhile.
    state_store = TaskStateStore()
    job = {"job_id": "fixed", "command": world.held("go", before=WRITE_RESULT)}
    dying = attempt("manual__1", state_store, job)

    job_id = die_in_its_wait(monkeypatch, dying)
    world.release("go")
    waits(monkeypatch, federation.tick)
    while not world.job(job_id).terminal:
        federation.tick()
    first_nonce = world.job(job_id).nonce
    # The retry finds it over (as after an answer lost on the way): the same result, read again.
    retry = attempt("manual__1", state_store, job, number=2)
    assert retry.execute()["result"] == RESULT
    assert attempt("manual__1", state_store, job, number=3).execute()["result"] == RESULT

    # Another run of the task names the same job id: a new incarnation, which writes nothing.
    world.release("again")
    rerun = attempt("manual__2", TaskStateStore(), {"job_id": "fixed", "command": "echo again"})
    waits(monkeypatch, federation.tick)
    kind, xcom = run_to_the_end(rerun, False, world.store)
    assert kind == "returned" and xcom["job_id"] == job_id
    assert world.job(job_id).nonce != first_nonce and world.job(job_id).state is JobState.SUCCEEDED
    assert xcom["result"] is None  # not the first incarnation's
    assert world.store.job_result(job_id, first_nonce) is None  # replaced, not kept beside the new one

"""When a submitting task's Airflow state orphans its job."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.orphans import (
    ORPHANING_TASK_STATES,
    KillAction,
    kill_message,
    orphaning_state,
    submitter_kill_action,
    task_state_key,
)


def test_mapped_task_instances_are_keyed_with_their_index() -> None:
    assert task_state_key("run", -1) == "run"
    assert task_state_key("run", 3) == "run_3"


@pytest.mark.parametrize("state", sorted(ORPHANING_TASK_STATES))
def test_a_failed_task_orphans_its_job(state: str) -> None:
    assert orphaning_state({"r1": {"run": state}}, "r1", "run", -1) == state
    assert orphaning_state({"r1": {"run_2": state}}, "r1", "run", 2) == state


@pytest.mark.parametrize("state", ["running", "deferred", "up_for_retry", "success", None])
def test_a_live_retrying_cleared_or_unknown_task_does_not(state: str | None) -> None:
    assert orphaning_state({"r1": {"run": state}}, "r1", "run", -1) is None
    assert orphaning_state({}, "r1", "run", -1) is None
    assert orphaning_state({"r1": {"run": "failed"}}, "r1", "run", 0) is None  # another map index's state


def test_killing_the_submitting_task_cancels_only_when_asked_to() -> None:
    assert submitter_kill_action(cancel_on_kill=False) is KillAction.CHECK
    assert submitter_kill_action(cancel_on_kill=True) is KillAction.CANCEL


def test_the_task_log_says_what_a_kill_did_to_the_job() -> None:
    assert (
        kill_message(KillAction.CANCEL, "/a/j") == "The task was killed, so job /a/j is cancelled (cancel_on_kill=True)"
    )
    check = kill_message(KillAction.CHECK, "/a/j")
    assert check.startswith("The task was killed; job /a/j keeps running.")
    assert "placement tick cancels the job" in check and "the next try reattaches" in check
    assert kill_message(KillAction.IGNORE, "/a/j").endswith("keeps running: this task only watches it")
    assert kill_message(KillAction.CHECK, "/a/j", settled=True) == (
        "The task was killed; job /a/j has already ended or is being cancelled"
    )

"""When a job has been orphaned by the Airflow task that submitted it, and what a kill does.

A submitting task in one of ``ORPHANING_TASK_STATES`` has given up on its job for good (a retry is
``up_for_retry``, a cleared task has no state: both will reattach, so neither is here). Airflow
answers task states keyed by task id, or ``<task_id>_<map_index>`` for a mapped task instance.

A kill is not such an answer. Airflow 3.3 tells a task process to stop with one signal, SIGTERM
(``on_kill``), whoever wants it stopped: a user marking it failed, success or cleared, the scheduler
resetting a task it thinks orphaned, or its worker shutting down (eviction, preemption, a deploy).
The triggerer's "user action" cancel (a deferred task's ``on_kill``) covers clear and mark-success as
well as mark-failed, and also fires when another triggerer takes the trigger over. Only the task's
recorded state tells them apart, so by default a kill cancels nothing: it asks the tick to check
that state now (:attr:`KillAction.CHECK`), and the tick cancels when it is orphaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

ORPHANING_TASK_STATES = frozenset({"failed", "upstream_failed"})


def task_state_key(task_id: str, map_index: int) -> str:
    """The key of a task instance in Airflow's ``get_task_states`` answer."""
    return task_id if map_index < 0 else f"{task_id}_{map_index}"


def orphaning_state(states: Mapping[str, Mapping[str, Any]], run_id: str, task_id: str, map_index: int) -> str | None:
    """The task's state when it orphans its job, else None (running, retrying, cleared, unknown)."""
    state = states.get(run_id, {}).get(task_state_key(task_id, map_index))
    return state if state in ORPHANING_TASK_STATES else None


# A task in one of these states is still going: it may reattach to its job (and read its result).
LIVE_TASK_STATES = frozenset(
    {"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)


def task_may_reattach(states: Mapping[str, Mapping[str, Any]], run_id: str, task_id: str, map_index: int) -> bool:
    """Whether the task that submitted a job is still going (so its finished job must be kept)."""
    return states.get(run_id, {}).get(task_state_key(task_id, map_index)) in LIVE_TASK_STATES


# The history event a killed waiting task leaves on its job; it wakes the placement tick, whose
# orphan check then reads the task's state.
TASK_KILLED = "task_killed"


class KillAction(StrEnum):
    """What killing a task that waits on a job does to that job."""

    CHECK = "check"  # the submitting task (default): the tick checks the task's state now, cancels if orphaning
    CANCEL = "cancel"  # the job ends with the task's attempt, whatever killed it (``cancel_on_kill=True``)
    IGNORE = "ignore"  # a watcher (the sensor) or a mirror (the peer's runner DAG): the job is not the task's


def submitter_kill_action(cancel_on_kill: bool) -> KillAction:
    """What killing the task that submitted a job does: cancel it only when asked to."""
    return KillAction.CANCEL if cancel_on_kill else KillAction.CHECK


def kill_message(action: KillAction, job_id: str, *, settled: bool = False) -> str:
    """What the task log says when the task waiting on ``job_id`` is killed; ``settled``: the job had
    already ended or was being cancelled (execution_timeout cancels it before Airflow's on_kill)."""
    if settled:
        return f"The task was killed; job {job_id} has already ended or is being cancelled"
    if action is KillAction.CANCEL:
        return f"The task was killed, so job {job_id} is cancelled (cancel_on_kill=True)"
    if action is KillAction.CHECK:
        return (
            f"The task was killed; job {job_id} keeps running. If the task has failed (marked failed, or its "
            "DAG run), the placement tick cancels the job now; after a worker shutdown, a reset, a clear or "
            "a retry, the next try reattaches to it"
        )
    return f"The task was killed; job {job_id} keeps running: this task only watches it"

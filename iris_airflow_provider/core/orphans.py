"""When a job has been orphaned by the Airflow task that submitted it.

A submitting task in one of ``ORPHANING_TASK_STATES`` has given up on its job for good (a retry is
``up_for_retry``, a cleared task has no state: both will reattach, so neither is here). Airflow
answers task states keyed by task id, or ``<task_id>_<map_index>`` for a mapped task instance.
"""

from __future__ import annotations

from collections.abc import Mapping
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

"""Cancelling jobs whose submitting Airflow task has given up on them for good, and killed tasks.

The tick cancels a live job whose submitting task is in an orphaning state (marked failed, its DAG
run failed, or failed for good after its worker was lost): nobody will reattach to it. Which task
states orphan a job is the core's rule (:mod:`iris_airflow_provider.core.orphans`); Airflow's answer
comes in as ``task_states``. A killed task does what its :class:`KillAction` says: by default it
only leaves an event that wakes the tick, so that check runs within seconds.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from iris_airflow_provider.core.orphans import TASK_KILLED, KillAction, kill_message, orphaning_state, task_state_key
from iris_airflow_provider.services.ports import CancelStore
from iris_airflow_provider.store.records import CancelOutcome, JobRecord

log = logging.getLogger(__name__)

# (dag_id, run_ids, task_ids) -> {run_id: {task_id or "<task_id>_<map_index>": state}}, as Airflow's
# RuntimeTaskInstance.get_task_states answers.
TaskStates = Callable[[str, list[str], list[str]], Mapping[str, Mapping[str, Any]]]


TaskStatesAnswer = Mapping[str, Mapping[str, Any]]


def submitting_task_states(
    jobs: Iterable[JobRecord], task_states: TaskStates
) -> list[tuple[str, list[JobRecord], TaskStatesAnswer | None]]:
    """The jobs with an origin, grouped by DAG, each group with Airflow's states of the tasks that
    submitted them (one question per DAG); None where Airflow could not answer (logged; the next
    tick asks again)."""
    by_dag: dict[str, list[JobRecord]] = defaultdict(list)
    for job in jobs:
        if job.origin is not None:
            by_dag[job.origin.dag_id].append(job)
    answers: list[tuple[str, list[JobRecord], TaskStatesAnswer | None]] = []
    for dag_id, dag_jobs in by_dag.items():
        origins = [job.origin for job in dag_jobs if job.origin is not None]
        try:
            states = task_states(dag_id, sorted({o.run_id for o in origins}), sorted({o.task_id for o in origins}))
        except Exception as error:  # Airflow's API is down
            log.warning("Could not read the states of %s's tasks: %s", dag_id, error)
            states = None
        answers.append((dag_id, dag_jobs, states))
    return answers


def cancel_orphans(store: CancelStore, task_states: TaskStates, cancel: Callable[[str], CancelOutcome]) -> list[str]:
    """Cancel the live jobs whose submitting task failed; the ids of the jobs cancelled."""
    uncancelled = (job for job in store.live_jobs_with_origin() if not job.cancel_requested)
    cancelled: list[str] = []
    for dag_id, jobs, states in submitting_task_states(uncancelled, task_states):
        if states is None:
            continue
        for job in jobs:
            origin = job.origin
            assert origin is not None
            state = orphaning_state(states, origin.run_id, origin.task_id, origin.map_index)
            if state is not None:
                key = task_state_key(origin.task_id, origin.map_index)
                log.warning(
                    "Cancelling job %s: the task that submitted it (%s/%s/%s) is %s",
                    job.job_id,
                    dag_id,
                    origin.run_id,
                    key,
                    state,
                )
                cancel(job.job_id)
                cancelled.append(job.job_id)
    return cancelled


class KillStore(Protocol):
    def get_job(self, job_id: str) -> JobRecord | None: ...

    def record_event(self, job_id: str, kind: str, now_ms: int, detail: str = "") -> bool: ...


def task_killed(
    store: KillStore, cancel: Callable[[str], CancelOutcome], job_id: str, action: KillAction, now_ms: int
) -> str:
    """Carry out what killing the task waiting on ``job_id`` does to it; what the task log should say."""
    job = store.get_job(job_id)
    if job is None or job.terminal or job.cancel_requested:
        return kill_message(action, job_id, settled=True)
    message = kill_message(action, job_id)
    if action is KillAction.CANCEL:
        cancel(job_id)
    elif action is KillAction.CHECK:
        store.record_event(job_id, TASK_KILLED, now_ms, message)  # wakes the tick, whose check reads the task state
    return message

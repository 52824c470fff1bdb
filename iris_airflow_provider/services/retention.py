"""Bounded storage: the tick prunes finished jobs older than the cluster's ``retention_days``.

In bounded batches, so a tick stays short however much has piled up: never a job that is not
finished, never one whose submitting task is still going (it may reattach and read the result),
and never an incarnation that ran again since it was judged (the store's delete is conditional).
Output of incarnations a job has since replaced goes too, once it is as old.
"""

from __future__ import annotations

import logging

from iris_airflow_provider.core.orphans import task_may_reattach
from iris_airflow_provider.services.orphans import TaskStates, submitting_task_states
from iris_airflow_provider.services.ports import RetentionStore
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)

PRUNE_BATCH = 500  # jobs per tick
OUTPUT_PRUNE_BATCH = 500  # replaced incarnations whose output goes, per tick


def prune_finished(
    store: RetentionStore, now_ms: int, retention_ms: int, task_states: TaskStates | None = None
) -> list[str]:
    """Delete up to one batch of jobs finished more than ``retention_ms`` ago; the ids deleted."""
    if retention_ms <= 0:
        return []
    cutoff = now_ms - retention_ms
    candidates = store.finished_before(cutoff, PRUNE_BATCH)
    kept = _reattachable(candidates, task_states)
    pruned = store.prune_jobs([(j.job_id, j.nonce) for j in candidates if j.job_id not in kept], cutoff)
    lines = store.prune_superseded_output(cutoff, OUTPUT_PRUNE_BATCH)
    if pruned or lines:
        log.info("Retention: pruned %d finished job(s) and %d superseded output line(s)", len(pruned), lines)
    return pruned


def _reattachable(jobs: list[JobRecord], task_states: TaskStates | None) -> set[str]:
    """The jobs whose submitting task is still going (all of them with an origin, when Airflow cannot say)."""
    if task_states is None:
        return {job.job_id for job in jobs if job.origin is not None}
    kept: set[str] = set()
    for _, dag_jobs, states in submitting_task_states(jobs, task_states):
        for job in dag_jobs:
            origin = job.origin
            assert origin is not None
            if states is None or task_may_reattach(states, origin.run_id, origin.task_id, origin.map_index):
                kept.add(job.job_id)
    return kept

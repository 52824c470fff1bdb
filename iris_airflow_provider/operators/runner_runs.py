"""Received jobs as DAG runs: each accepted handoff is one run of ``iris_federation_runner``.

So the peer's own operators see every job other clusters handed them, in their own Airflow UI,
under a run id derived from the job id and its incarnation.
"""

from __future__ import annotations

import re

from iris_airflow_provider.store.records import JobRecord

RUNNER_DAG_ID = "iris_federation_runner"
_NOT_ALLOWED_IN_RUN_ID = re.compile(r"[^A-Za-z0-9_.~:+-]")


def runner_run_id(job_id: str, nonce: str) -> str:
    """``iris__alice~train__1a2b3c4d``: readable, within Airflow's allowed run id characters."""
    readable = _NOT_ALLOWED_IN_RUN_ID.sub("-", job_id.strip("/").replace("/", "~"))
    return f"iris__{readable[:200]}__{nonce[:8]}"


def start_runner_run(job: JobRecord) -> None:
    """Create the job's run of the runner DAG; nothing happens when it already exists."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagRunAlreadyExists
    from airflow.utils.types import DagRunTriggeredByType

    try:
        trigger_dag(
            RUNNER_DAG_ID,
            triggered_by=DagRunTriggeredByType.REST_API,
            run_id=runner_run_id(job.job_id, job.nonce),
            conf={"job_id": job.job_id, "nonce": job.nonce, "requester": job.peer_id},
            triggering_user_name=job.submitting_user,
            replace_microseconds=False,
        )
    except DagRunAlreadyExists:
        return

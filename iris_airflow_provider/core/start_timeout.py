"""Start timeout: a job a live peer accepted but has not started within the timeout was placed on
capacity that was not really there. Unless pinned, it is withdrawn (terminated there by its nonce,
and back to the queue under a new nonce, avoiding that peer, only once the peer confirms), so a
long queue on one peer does not hold a job that another could run now.

The timeout is the cluster's ``placement.start_timeout_seconds`` unless the job sets its own
``start_timeout_seconds``; 0 turns it off. It runs from when the peer admitted the job.
"""

from __future__ import annotations

from iris_airflow_provider.core.states import JobState

NOT_STARTED = (JobState.PENDING, JobState.ACCEPTED)


def start_timeout_ms(job_seconds: int | None, cluster_seconds: float) -> int:
    """The timeout that applies to a job (0: none)."""
    seconds = cluster_seconds if job_seconds is None else job_seconds
    return int(seconds * 1000)


def start_overdue(
    *,
    state: JobState,
    started: bool,
    pinned: bool,
    handed_off_at_ms: int | None,
    now_ms: int,
    timeout_ms: int,
) -> bool:
    """Whether a job its peer admitted at ``handed_off_at_ms`` is to be withdrawn for not starting."""
    if pinned or timeout_ms <= 0 or handed_off_at_ms is None:
        return False
    if started or state not in NOT_STARTED:
        return False
    return now_ms - handed_off_at_ms >= timeout_ms


def withdrawal_records(reported: JobState) -> bool:
    """Whether a report in state ``reported`` about a job being withdrawn is left to the withdrawal:
    its peer killing it is the withdrawal's own doing, which then requeues it (a job that finished
    or failed there meanwhile ends as reported)."""
    return reported is JobState.KILLED

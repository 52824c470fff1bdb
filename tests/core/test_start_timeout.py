"""Start timeout: a job a live peer accepted but has not started in time is withdrawn, unless pinned."""

from __future__ import annotations

from iris_airflow_provider.core.start_timeout import start_overdue, start_timeout_ms, withdrawal_records
from iris_airflow_provider.core.states import JobState

NOW = 10_000_000_000
TIMEOUT = 1_800_000


def overdue(
    *,
    state: JobState = JobState.PENDING,
    started: bool = False,
    pinned: bool = False,
    since: int | None = NOW - TIMEOUT,
    timeout: int = TIMEOUT,
) -> bool:
    return start_overdue(
        state=state, started=started, pinned=pinned, handed_off_at_ms=since, now_ms=NOW, timeout_ms=timeout
    )


def test_the_job_setting_wins_over_the_cluster_and_zero_turns_it_off() -> None:
    assert start_timeout_ms(None, 1800) == TIMEOUT
    assert start_timeout_ms(60, 1800) == 60_000
    assert start_timeout_ms(0, 1800) == 0
    assert start_timeout_ms(None, 0) == 0


def test_a_job_admitted_and_not_started_within_the_timeout_is_overdue() -> None:
    assert overdue() and overdue(state=JobState.ACCEPTED)
    assert not overdue(since=NOW - TIMEOUT + 1)


def test_a_started_pinned_or_untimed_job_is_never_overdue() -> None:
    assert not overdue(state=JobState.RUNNING)
    assert not overdue(started=True)  # it ran, and is pending again there (a restart): not a placement mistake
    assert not overdue(pinned=True)
    assert not overdue(timeout=0)
    assert not overdue(since=None)  # not admitted yet: the delivery's own rules apply


def test_a_kill_reported_while_withdrawing_is_the_withdrawals_own_doing() -> None:
    assert withdrawal_records(JobState.KILLED)
    assert not withdrawal_records(JobState.SUCCEEDED) and not withdrawal_records(JobState.FAILED)

"""Waiting in tests: poll a condition until it holds, or fail naming what was awaited.

One helper for every suite (backends, services, end-to-end), always called as
``wait_for(check, what, timeout=...)``: a test never sleeps for a fixed time to let something happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from iris_airflow_provider.backends.base import JobReport
from iris_airflow_provider.core.states import JobState

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, *, timeout: float = 10.0, interval: float = 0.05) -> T:
    """The first truthy value ``check`` returns; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class ReportsStatus(Protocol):
    def status(self, job_id: str) -> Any: ...


def wait_state(backend: ReportsStatus, job_id: str, *states: JobState, timeout: float = 10.0) -> JobReport:
    """The backend's report of ``job_id`` once it is in one of ``states``; on a time-out, the error
    shows the last report."""
    last: list[JobReport | None] = [None]

    def reached() -> JobReport | None:
        report = last[0] = backend.status(job_id)
        return report if report is not None and report.state in states else None

    try:
        return wait_for(reached, f"{job_id} to reach {', '.join(s.value for s in states)}", timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}; last report: {last[0]}") from None

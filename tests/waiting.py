"""Waiting in tests: poll a condition until it holds, or fail naming what was awaited.

One helper for every suite (backends, services, triggers, end-to-end), called as
``wait_for(check, what, timeout=...)`` or, on an event loop, ``await eventually(check, what, ...)``:
a test never sleeps for a fixed time to let something happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from iris_airflow_provider.backends.base import JobReport
from iris_airflow_provider.core.states import JobState

T = TypeVar("T")


class _Deadline:
    def __init__(self, what: str, timeout: float) -> None:
        self.what, self.timeout, self.end = what, timeout, time.monotonic() + timeout

    def met(self, value: object) -> bool:
        """Whether ``value`` ends the wait; ``AssertionError`` naming what was awaited once time is up."""
        if value:
            return True
        if time.monotonic() > self.end:
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {self.what}")
        return False


def wait_for(check: Callable[[], T | None], what: str, *, timeout: float = 10.0, interval: float = 0.05) -> T:
    """The first truthy value ``check`` returns; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = _Deadline(what, timeout)
    while not deadline.met(value := check()):
        time.sleep(interval)
    return value  # type: ignore[return-value]  # truthy, so not None


async def eventually(check: Callable[[], T | None], what: str, *, timeout: float = 5.0, interval: float = 0.01) -> T:
    """:func:`wait_for` on an event loop: the loop keeps running while it waits."""
    deadline = _Deadline(what, timeout)
    while not deadline.met(value := check()):
        await asyncio.sleep(interval)
    return value  # type: ignore[return-value]


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

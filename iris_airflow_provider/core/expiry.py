"""Expiry: a queued job past its scheduling deadline can never be placed; it ends unschedulable.

The rule only (which candidates expire at ``now_ms``, and with which error); the store applies it
with compare-and-set writes, so a job that left the queue meanwhile is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from iris_airflow_provider.core import reasons


@dataclass(frozen=True, slots=True)
class Expiry:
    """A queued job to end as unschedulable: its id, the deadline it missed, and its error."""

    job_id: str
    scheduling_deadline_ms: int
    error: str = reasons.SCHEDULING_TIMEOUT


def past_deadline(deadline_ms: int | None, now_ms: int) -> bool:
    """Whether a job with this scheduling deadline (None: none) has missed it at ``now_ms``."""
    return deadline_ms is not None and deadline_ms < now_ms


def expiries(candidates: Iterable[tuple[str, int | None]], now_ms: int) -> list[Expiry]:
    """The queued ``(job id, scheduling deadline)`` candidates past their deadline, by job id."""
    return [
        Expiry(job_id, deadline)
        for job_id, deadline in sorted(candidates, key=lambda candidate: candidate[0])
        if deadline is not None and past_deadline(deadline, now_ms)
    ]

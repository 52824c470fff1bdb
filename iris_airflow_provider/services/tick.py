"""The placement tick: one pass of each federation step, in order, and the report of what it did.

orphan cancels (with Airflow's task states) -> heartbeat -> expire -> plan and promote -> deliver
-> sync -> relay logs -> cancel re-drive -> abandoned cleanup. Each step lives in its own module;
this one only sequences them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from iris_airflow_provider.services.abandoned import terminate_abandoned
from iris_airflow_provider.services.cancel import Cancels
from iris_airflow_provider.services.delivery import Delivery
from iris_airflow_provider.services.heartbeat import Heartbeats
from iris_airflow_provider.services.mirror import Mirror
from iris_airflow_provider.services.orphans import TaskStates, cancel_orphans
from iris_airflow_provider.services.placement import Placement
from iris_airflow_provider.services.ports import ServiceStore

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    started_at_ms: int
    heartbeats: dict[str, str] = field(default_factory=dict)  # peer -> "ok" or the error
    expired: list[str] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)  # "job->peer/backend"
    holding: list[str] = field(default_factory=list)  # "peer/backend for job": held for starving jobs
    delivered: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # back to the queue from a peer that could not take them
    reported: list[str] = field(default_factory=list)  # jobs whose state changed from a report
    cancelled: list[str] = field(default_factory=list)  # cancels confirmed by whoever runs the job
    pending: int = 0
    duration_ms: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{len(self.heartbeats)} peer(s) heartbeated"]
        names = (
            "expired",
            "promoted",
            "holding",
            "delivered",
            "rejected",
            "retrying",
            "requeued",
            "reported",
            "cancelled",
        )
        for name in names:
            items: list[str] = getattr(self, name)
            if items:
                parts.append(f"{name} {len(items)}: {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
        parts.append(f"{self.pending} still queued")
        return "; ".join(parts) + f" ({self.duration_ms} ms)"


@dataclass(frozen=True, slots=True)
class Tick:
    store: ServiceStore
    clock: Callable[[], int]
    heartbeats: Heartbeats
    placement: Placement
    delivery: Delivery
    mirror: Mirror
    cancels: Cancels
    timeout_s: float  # for peers asked about abandoned incarnations

    def run(self, task_states: TaskStates | None = None) -> TickReport:
        """One pass of each step. With ``task_states`` (Airflow's view of the tasks that submitted
        jobs), jobs whose task has failed are cancelled first."""
        report = TickReport(started_at_ms=self.clock())
        if task_states is not None:
            report.cancelled += cancel_orphans(self.store, task_states, self.cancels.cancel)
        report.heartbeats = self.heartbeats.all()
        report.expired = self.store.expire_queued(self.clock())
        placed = self.placement.place()
        report.promoted, report.pending, report.holding = placed.promoted, placed.pending, placed.holding
        delivered = self.delivery.deliver()
        report.delivered += delivered.delivered
        report.rejected += delivered.rejected
        report.retrying += delivered.retrying
        report.requeued += delivered.requeued
        in_flight = self.mirror.sync(report.reported)
        self.mirror.relay_logs(in_flight)
        report.cancelled += self.cancels.redrive()
        report.cancelled += terminate_abandoned(self.store, self.heartbeats.peers, self.clock, self.timeout_s)
        report.duration_ms = self.clock() - report.started_at_ms
        log.info("Federation tick: %s", report.summary())
        return report

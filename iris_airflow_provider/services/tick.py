"""The placement tick: one pass of each federation step, in order, and the report of what it did.

orphan cancels (with Airflow's task states) -> heartbeat -> settle lost peers -> expire -> plan and
promote -> deliver -> sync -> withdraw jobs not started in time -> relay logs -> cancel re-drive ->
abandoned cleanup -> retention -> bundle store collection. Each step lives in its own module; this
one only sequences them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from iris_airflow_provider.services.abandoned import terminate_abandoned
from iris_airflow_provider.services.cancel import Cancels
from iris_airflow_provider.services.delivery import Delivery
from iris_airflow_provider.services.heartbeat import Heartbeats
from iris_airflow_provider.services.lost_peers import LostPeers
from iris_airflow_provider.services.mirror import Mirror
from iris_airflow_provider.services.orphans import TaskStates, cancel_orphans
from iris_airflow_provider.services.placement import Placement
from iris_airflow_provider.services.ports import ServiceStore
from iris_airflow_provider.services.retention import prune_finished
from iris_airflow_provider.services.withdrawals import Withdrawals
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)

TICK_LEASE = "placement-tick"
# Longer than any step takes (each step renews it), short enough that a killed tick's lease is
# taken over within a couple of scheduled ticks.
TICK_LEASE_MS = 120_000


class LeaseLostError(Exception):
    """This tick held the lease too long: another may have started, so this one stops."""


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
    lost: list[str] = field(default_factory=list)  # ended because their peer was lost (or removed)
    withdrawn: list[str] = field(default_factory=list)  # taken back from a peer that did not start them
    reported: list[str] = field(default_factory=list)  # jobs whose state changed from a report
    cancelled: list[str] = field(default_factory=list)  # cancels confirmed by whoever runs the job
    orphaned: list[str] = field(default_factory=list)  # children cancelled because their parent ended
    pruned: list[str] = field(default_factory=list)  # finished jobs past the retention, deleted
    collected: list[str] = field(default_factory=list)  # workdir bundles (and abandoned uploads) let go
    pending: int = 0
    duration_ms: int = 0
    skipped: str = ""  # why this tick did nothing (another tick held the lease), or "" when it ran

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        parts = [f"{len(self.heartbeats)} peer(s) heartbeated"]
        names = (
            "expired",
            "promoted",
            "holding",
            "delivered",
            "rejected",
            "retrying",
            "requeued",
            "lost",
            "withdrawn",
            "reported",
            "cancelled",
            "orphaned",
            "pruned",
            "collected",
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
    lost_peers: LostPeers
    withdrawals: Withdrawals
    timeout_s: float  # for peers asked about abandoned incarnations
    retention_ms: int = 0  # finished jobs older than this are pruned (0: never)
    # Rewrites the tokens of live jobs whose backend keeps them in a file (services/job_tokens.py).
    renew_job_tokens: Callable[[list[JobRecord]], int] | None = None
    # Lets go of workdir bundles no live job needs, at the given time (services/bundle_retention.py).
    collect_bundles: Callable[[int], list[str]] | None = None

    def run(self, task_states: TaskStates | None = None) -> TickReport:
        """One pass of each step, under the tick lease: however ticks are started (the schedule, a
        manual trigger, a second deployment on the same store), two never overlap; the second skips.
        With ``task_states`` (Airflow's view of the tasks that submitted jobs), jobs whose task has
        failed are cancelled first."""
        report = TickReport(started_at_ms=self.clock())
        holder = uuid.uuid4().hex
        if not self.store.acquire_lease(TICK_LEASE, holder, self.clock(), TICK_LEASE_MS):
            report.skipped = f"another tick holds the {TICK_LEASE} lease"
            log.info("Federation tick: %s", report.summary())
            return report
        try:
            self._steps(report, task_states, holder)
        except LeaseLostError as lost:
            report.skipped = str(lost)
            log.warning("Federation tick stopped early: %s", lost)
        finally:
            self.store.release_lease(TICK_LEASE, holder)
        report.duration_ms = self.clock() - report.started_at_ms
        log.info("Federation tick: %s", report.summary())
        return report

    def _renew(self, holder: str, step: str) -> None:
        """Extend the lease before a step that writes; a tick that outlived its lease stops there."""
        if not self.store.acquire_lease(TICK_LEASE, holder, self.clock(), TICK_LEASE_MS):
            raise LeaseLostError(f"the {TICK_LEASE} lease expired before {step}; another tick may be running")

    def _steps(self, report: TickReport, task_states: TaskStates | None, holder: str) -> None:
        if task_states is not None:
            report.cancelled += cancel_orphans(self.store, task_states, self.cancels.cancel)
        report.heartbeats = self.heartbeats.all()
        self._renew(holder, "lost peers")
        settled = self.lost_peers.settle()
        report.lost += settled.failed
        report.requeued += settled.requeued
        self._renew(holder, "placement")
        report.expired = self.store.expire_queued(self.clock())
        placed = self.placement.place()
        report.promoted, report.pending, report.holding = placed.promoted, placed.pending, placed.holding
        self._renew(holder, "delivery")
        delivered = self.delivery.deliver()
        report.delivered += delivered.delivered
        report.rejected += delivered.rejected
        report.retrying += delivered.retrying
        report.requeued += delivered.requeued
        self._renew(holder, "sync")
        in_flight = self.mirror.sync(report.reported)
        report.orphaned += self.cancels.kill_orphans()
        if self.renew_job_tokens is not None:
            self.renew_job_tokens(in_flight)
        self._renew(holder, "withdrawals")
        report.withdrawn += self.withdrawals.withdraw()
        self.mirror.relay_logs(in_flight)
        self._renew(holder, "cancel re-drive")
        report.cancelled += self.cancels.redrive()
        report.cancelled += terminate_abandoned(self.store, self.heartbeats.peers, self.clock, self.timeout_s)
        self._renew(holder, "retention")
        report.pruned = prune_finished(self.store, self.clock(), self.retention_ms, task_states)
        if self.collect_bundles is not None:
            report.collected = self.collect_bundles(self.clock())

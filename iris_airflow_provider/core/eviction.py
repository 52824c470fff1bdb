"""Band eviction on a backend: one scheduling pass over its queue, as a pure plan.

A backend that runs jobs itself (the ``process`` backend) keeps a queue in band order (band rank,
then submit time, then job id). Each pass walks that queue:

- a job whose devices are free starts, on the lowest free slots of each variant it needs;
- a job that does not fit may evict *strictly lower-band* running work, lowest band first, then
  the newest (latest started) first, but only when evicting is enough to fit it. Slots of jobs
  already on their way out (``evicting``) count as freed: the job claims as many of them as it
  needs, so neither it nor a later job in the pass evicts more for the same slots;
- once ``max_running_jobs`` jobs run, the pass stops; if nobody is on their way out yet, the job
  at the head of the remaining queue frees a run slot by evicting one job, chosen as above.

Evicted work goes back to the queue once it has stopped (the backend's concern). The pass returns
the jobs to start, with their slots, and the jobs to evict; the backend carries it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from iris_airflow_provider.core.bands import Band


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job waiting in the backend's queue, and the device slots it needs per variant."""

    job_id: str
    band: Band
    submitted_at_ms: int
    need: Mapping[str, int] = field(default_factory=dict)

    def queue_key(self) -> tuple[int, int, str]:
        return (self.band.rank, self.submitted_at_ms, self.job_id)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding slots: which slot numbers of which variant, since when, and whether it is
    already being evicted (told to stop, its slots not free yet)."""

    job_id: str
    band: Band
    slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    started_at_ms: int = 0
    evicting: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """What the backend has: device slots per variant (numbered ``0 .. n-1``), and at most how many
    jobs may run at once (``None``: no limit but the devices)."""

    devices: Mapping[str, int] = field(default_factory=dict)
    max_running_jobs: int | None = None


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    slots: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """What one pass decided: jobs to start (in queue order) and jobs to evict (in decision order)."""

    starts: tuple[Start, ...] = ()
    evictions: tuple[str, ...] = ()


def plan_pass(queued: Iterable[QueuedJob], running: Iterable[RunningJob], limits: Limits) -> SchedulePlan:
    """One scheduling pass: which queued jobs start (on which slots) and which running jobs to evict."""
    holders = list(running)
    evicting = {holder.job_id for holder in holders if holder.evicting}
    # Slots of jobs already being evicted: freed soon, and already promised to whoever evicted them.
    draining: dict[str, int] = {}
    for holder in holders:
        if holder.evicting:
            for variant, held in holder.slots.items():
                draining[variant] = draining.get(variant, 0) + len(held)
    starts: list[Start] = []
    evictions: list[str] = []

    def evict(job_id: str) -> None:
        evictions.append(job_id)
        evicting.add(job_id)

    for job in sorted(queued, key=QueuedJob.queue_key):
        if limits.max_running_jobs is not None and len(holders) >= limits.max_running_jobs:
            # Every run slot is taken: a higher band frees one by evicting the lowest-band, newest
            # job (unless one is already on its way out), as it would free devices.
            if not evicting:
                for victim in eviction_order(job.band, holders, evicting)[:1]:
                    evict(victim.job_id)
            break
        free = free_slots(limits.devices, holders)
        if all(len(free.get(v, ())) >= n for v, n in job.need.items()):
            slots = {v: free[v][:n] for v, n in job.need.items()}
            starts.append(Start(job.job_id, slots))
            holders.append(RunningJob(job.job_id, job.band, slots))
            continue
        for victim in _victims(job, holders, free, draining, evicting):
            evict(victim.job_id)
    return SchedulePlan(tuple(starts), tuple(evictions))


def free_slots(devices: Mapping[str, int], running: Iterable[RunningJob]) -> dict[str, tuple[int, ...]]:
    """The slot numbers of each variant that no running job holds, lowest first."""
    taken: dict[str, set[int]] = {}
    for job in running:
        for variant, slots in job.slots.items():
            taken.setdefault(variant, set()).update(slots)
    return {v: tuple(s for s in range(total) if s not in taken.get(v, set())) for v, total in devices.items()}


def eviction_order(band: Band, running: Iterable[RunningJob], evicting: set[str]) -> list[RunningJob]:
    """The running jobs work of ``band`` may evict, in the order it evicts them: lowest band, then
    newest first. Jobs already being evicted are not candidates again."""
    return sorted(
        (r for r in running if band.outranks(r.band) and r.job_id not in evicting),
        key=lambda r: (-r.band.rank, -r.started_at_ms),
    )


def _victims(
    job: QueuedJob,
    running: list[RunningJob],
    free: Mapping[str, tuple[int, ...]],
    draining: dict[str, int],
    evicting: set[str],
) -> list[RunningJob]:
    """Lower-band running jobs whose eviction frees enough for ``job``: lowest band, newest first;
    none when even evicting all of them would not be enough.

    Slots still held by jobs already being evicted (``draining``) count as freed: evicting more
    while they drain would take more than ``job`` needs. The job claims the draining slots it
    counts on (``draining`` is updated), so the next queued job does not count them too.
    """
    need = job.need
    claimed = {v: min(draining.get(v, 0), max(0, n - len(free.get(v, ())))) for v, n in need.items()}
    chosen: list[RunningJob] = []
    available = {v: len(free.get(v, ())) + claimed[v] for v in need}
    for candidate in eviction_order(job.band, running, evicting):
        if all(available[v] >= n for v, n in need.items()):
            break
        gives = candidate.slots
        if not any(v in gives for v in need):
            continue
        chosen.append(candidate)
        for v in need:
            available[v] += len(gives.get(v, ()))
    if not all(available[v] >= n for v, n in need.items()):
        return []
    for v, n in claimed.items():
        draining[v] = draining.get(v, 0) - n
    return chosen


__all__ = ["Limits", "QueuedJob", "RunningJob", "SchedulePlan", "Start", "eviction_order", "free_slots", "plan_pass"]

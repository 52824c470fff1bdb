"""The placement step of the tick, and the one place its inputs are read from the store.

:func:`placement_snapshot` assembles what the pure placement pass reads (queued jobs as candidates,
the configured peers as last heartbeated, the jobs in flight on them, last tick's holds, the time);
the tick places from it and a pending job's explanation
(:mod:`iris_airflow_provider.services.job_views`) replays it. Placing applies the pass's promotions
by compare-and-set and saves its holds (conditionally: only for jobs still queued).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.object_stores import OBJECT_STORE_KEY, mismatch_message, unreadable_paths
from iris_airflow_provider.core.placement import Candidate, Promotion
from iris_airflow_provider.core.placement_projection import candidate
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place
from iris_airflow_provider.services.ports import AbandonedStore, PeerStateReads, PlacementStore
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)


def configured_peer_states(store: PeerStateReads, peer_ids: Iterable[str]) -> list[PeerState]:
    """The configured peers' states as the store last recorded them, in their order; a peer never
    heard from is unreachable."""
    known = {peer.peer_id: peer for peer in store.peer_states()}
    return [known.get(peer_id) or PeerState(peer_id, False, 0) for peer_id in peer_ids]


def _leftovers(store: AbandonedStore) -> dict[str, set[str]]:
    """Per job, the peers still to be told to drop an incarnation it left there."""
    leftovers: dict[str, set[str]] = defaultdict(set)
    for handoff in store.abandoned_handoffs():
        leftovers[handoff.job_id].add(handoff.peer_id)
    return leftovers


def queued_candidates(store: AbandonedStore, queued: Iterable[JobRecord], now_ms: int) -> list[Candidate]:
    """Queued jobs as the placement pass sees them at ``now_ms``. A job avoids the peers it was
    requeued from for a while, and any peer still to be told to drop what it left there: a new
    delivery would meet that earlier incarnation still running."""
    leftovers = _leftovers(store)
    return [
        Candidate.from_job(
            job.job_spec, job.submitted_at_ms, {*job.avoided_peer_ids(now_ms), *leftovers.get(job.job_id, ())}
        )
        for job in queued
    ]


def projected_candidates(store: PlacementStore, now_ms: int) -> list[Candidate]:
    """What :func:`queued_candidates` gives for every queued job, read from the columns placement
    needs (:mod:`iris_airflow_provider.core.placement_projection`) instead of parsing each spec. A
    row from before the projection existed has its spec parsed."""
    leftovers = _leftovers(store)
    candidates = []
    for job in store.queued_for_placement():
        avoided = {*job.avoided_peer_ids(now_ms), *leftovers.get(job.job_id, ())}
        if job.placement is None:
            spec = JobSpec.model_validate(job.spec)
            candidates.append(Candidate.from_job(spec, job.submitted_at_ms, avoided))
        else:
            candidates.append(
                candidate(
                    job.job_id,
                    job.priority_band,
                    job.submitted_at_ms,
                    job.scheduling_deadline_ms,
                    job.placement,
                    avoided,
                )
            )
    return candidates


def placement_snapshot(store: PlacementStore, peer_ids: Iterable[str], now_ms: int) -> PlacementSnapshot:
    """Everything one placement pass reads, from the store, at ``now_ms``."""
    return PlacementSnapshot(
        candidates=tuple(projected_candidates(store, now_ms)),
        peers=tuple(configured_peer_states(store, peer_ids)),
        ledger=(),
        now_ms=now_ms,
        in_flight=tuple(store.in_flight_handoffs()),
        holds=store.capacity_holds(),
    )


@dataclass(frozen=True, slots=True)
class Placed:
    promoted: list[str]  # "job->peer/backend"
    pending: int
    holding: list[str]  # "peer/backend for job"


class Placement:
    def __init__(
        self,
        store: PlacementStore,
        *,
        peer_ids: Iterable[str],
        rules: PlacementRules,
        clock: Callable[[], int],
    ) -> None:
        self.store = store
        self.peer_ids = list(peer_ids)
        self.rules = rules
        self.clock = clock

    def place(self) -> Placed:
        """Run the placement pass and apply its promotions by compare-and-set (a racing cancel wins)."""
        snapshot = placement_snapshot(self.store, self.peer_ids, self.clock())
        result = place(snapshot, self.rules)
        confirmed = self.store.apply_promotions(result.promotions, self.clock())
        promoted = [f"{p.job_id}->{p.peer_id}/{p.backend_id or '*'}" for p in confirmed]
        if confirmed:
            log.info("Federation: promoted %d queued job(s): %s", len(confirmed), ", ".join(promoted))
        saved = self.store.save_holds(result.holds, self.clock())
        holding = [f"{peer_id}/{backend_id} for {job_id}" for job_id, (peer_id, backend_id) in sorted(saved.items())]
        for hold in result.holds:
            if hold.job_id in saved and snapshot.holds.get(hold.job_id) != hold.key:
                log.info("Federation: %s: nothing behind it in the queue is placed there until it is", hold.text())
        advertised = {(p.peer_id, b.backend_id): b.advertised for p in snapshot.peers for b in p.backends}
        # Only a backend that says which object stores it reads can flag a job: only those jobs' specs are read.
        checked = [p for p in confirmed if OBJECT_STORE_KEY in advertised.get((p.peer_id, p.backend_id), {})]
        records = self.store.get_jobs(p.job_id for p in checked) if checked else {}
        for promotion in checked:
            if promotion.job_id in records:
                self._flag_unreadable_paths(records[promotion.job_id], promotion, advertised)
        return Placed(promoted, len(result.pending), holding)

    def _flag_unreadable_paths(
        self, job: JobRecord, promotion: Promotion, advertised: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> None:
        """Before the handoff: say so when the job names object-store paths its backend cannot read."""
        attributes = advertised.get((promotion.peer_id, promotion.backend_id), {})
        paths = unreadable_paths(job.job_spec, attributes)
        if paths:
            target = f"peer {promotion.peer_id} (backend {promotion.backend_id})"
            message = mismatch_message(job.job_id, target, paths, attributes[OBJECT_STORE_KEY])
            log.warning("%s", message)
            self.store.flag(
                job.job_id, job.nonce, "object_store_mismatch", message, self.clock(), peer_id=promotion.peer_id
            )

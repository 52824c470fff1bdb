"""The placement pass: which queued jobs to promote to which peer backend, on one tick.

Pure: it takes a snapshot (queued candidates, peers as last heartbeated, the reservations already
spoken for, the jobs in flight per peer, last tick's holds, the clock) and returns decisions; it
mutates nothing.

Rules (the reference's ``assign_queued``, plus where DESIGN.md goes beyond it):

- candidates go in queue order: band rank, then submit time, then job id;
- a candidate fits a backend when every routing constraint matches its advertised shape and, for a
  gated job (the devices of a concrete GPU or TPU variant, ``Resources.gate``), the backend's free
  amount plus what strictly lower bands hold there covers the gate. Availability is per backend, never summed;
- best first: a backend whose capacity is visible over a shape-only one; no preemption over
  preemption; the tightest fit; the most room for the device variants the job prefers
  (``prefer``: their amounts available at its band, free plus what lower bands hold, net of
  reservations; a shape-only backend or one reporting none reads 0); for ungated jobs, the peer
  with the fewest jobs in flight from this cluster plus promotions so far in this pass (spreading
  that lasts across ticks); then peer id, then backend id. A preference never blocks a placement
  and is never reserved;
- a job never goes to a peer it currently avoids (one that recently failed to take it);
- a pinned job only goes to its peer, and is force-routed there (backend ``""``) when the peer
  advertises no matching backend; so is a job without routing constraints on a peer with no
  backends;
- a full capacity-reporting backend means "wait", never force-routing past it;
- a candidate that fits nowhere stays queued and does not block the ones behind it, unless it has
  waited long enough to hold a backend (:mod:`iris_airflow_provider.core.holds`): then nothing
  behind it is placed there;
- at most ``max_per_peer`` promotions per peer per pass;
- the ledger (capacity reserved for jobs handed off and not yet running there, see
  :mod:`iris_airflow_provider.core.reservations`) is spent before anything is placed;
- a peer past the staleness bound is unreachable; a job past its deadline expires instead.

The pass is indexed (:mod:`iris_airflow_provider.core.placement_index`), not a scan of every
backend for every job; the tests keep the plain scan as a reference and check both agree, and
``bench/placement_bench.py`` times both on large states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from iris_airflow_provider.core import holds as holding
from iris_airflow_provider.core import ledger as ledger_math
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.capacity import WorkingCapacity
from iris_airflow_provider.core.constraints import Constraint, satisfies_all
from iris_airflow_provider.core.expiry import past_deadline
from iris_airflow_provider.core.holds import Hold
from iris_airflow_provider.core.ledger import BackendKey, LedgerEntry
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.placement_index import (
    Options,
    PeerMatch,
    Tracked,
    build_options,
    choose_gated,
    choose_ungated,
)

DEFAULT_MAX_HANDOFFS_PER_CYCLE = 8
DEFAULT_HEARTBEAT_STALENESS_MS = 120_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """A queued job as placement sees it."""

    job_id: str
    band: Band
    submitted_at_ms: int
    pinned_peer_id: str = ""
    shape: tuple[Constraint, ...] = ()
    gate: tuple[tuple[str, int], ...] = ()
    deadline_ms: int | None = None
    # Peers this job must not go to now: they recently failed to take it (requeued from them).
    avoided_peer_ids: frozenset[str] = frozenset()
    # Device variants it prefers room for (``JobSpec.prefer``): a tie-break, never a gate.
    prefer: tuple[str, ...] = ()

    @classmethod
    def from_job(cls, job: JobSpec, submitted_at_ms: int, avoided_peer_ids: Iterable[str] = ()) -> Candidate:
        return cls(
            job_id=job.job_id,
            band=job.priority_band,
            submitted_at_ms=submitted_at_ms,
            pinned_peer_id=job.pin,
            shape=job.routing,
            gate=tuple(sorted(job.gate.items())),
            deadline_ms=job.scheduling_deadline_ms,
            avoided_peer_ids=frozenset(avoided_peer_ids),
            prefer=job.prefer,
        )

    def queue_key(self) -> tuple[int, int, str]:
        return (self.band.rank, self.submitted_at_ms, self.job_id)

    def expired(self, now_ms: int) -> bool:
        return past_deadline(self.deadline_ms, now_ms)


@dataclass(frozen=True, slots=True)
class Promotion:
    job_id: str
    peer_id: str
    backend_id: str  # "" when force-routed to a peer that advertises no matching backend
    preempts: bool
    reserved: Mapping[str, int]
    observation_epoch_ms: int | None  # None for shape-only and force-routed placements

    def to_wire(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "peer_id": self.peer_id,
            "backend_id": self.backend_id,
            "preempts": self.preempts,
            "reserved": dict(self.reserved),
            "observation_epoch_ms": self.observation_epoch_ms,
        }


class Pending(NamedTuple):
    """A job left queued, with the seed's reason. A named tuple: one is made per unplaced job, and
    at 100k queued jobs a frozen dataclass's ``__init__`` alone is a tenth of the pass."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class PlacementResult:
    promotions: tuple[Promotion, ...]
    pending: tuple[Pending, ...]
    expired: tuple[str, ...]
    ledger: tuple[LedgerEntry, ...]
    # Capacity left on each capacity-reporting reachable backend after this pass.
    remaining: Mapping[BackendKey, WorkingCapacity] = field(default_factory=dict, repr=False)
    promoted_per_peer: Mapping[str, int] = field(default_factory=dict)
    # Backends held for starving jobs, in queue order of their jobs.
    holds: tuple[Hold, ...] = ()
    # What the ledger reserved on each backend before this pass placed anything.
    reserved: Mapping[BackendKey, Mapping[str, int]] = field(default_factory=dict)


def plan(
    candidates: Iterable[Candidate],
    peers: Sequence[PeerState],
    ledger: Iterable[LedgerEntry] = (),
    *,
    now_ms: int,
    max_per_peer: int = DEFAULT_MAX_HANDOFFS_PER_CYCLE,
    staleness_ms: int = DEFAULT_HEARTBEAT_STALENESS_MS,
    active_jobs: Mapping[str, int] | None = None,
    previous_holds: Mapping[str, BackendKey] | None = None,
    reserve_after_ms: int | None = None,
) -> PlacementResult:
    """One pass. ``active_jobs``: jobs this cluster has in flight per peer; ``previous_holds``: the
    backend each job held after the last pass (by job id); ``reserve_after_ms``: how long a gated
    job waits before it may hold a backend (None or 0: never)."""
    if max_per_peer < 1:
        raise ValueError("max_per_peer must be >= 1")
    live: list[Candidate] = []
    expired: list[Candidate] = []
    for candidate in candidates:
        (expired if candidate.expired(now_ms) else live).append(candidate)
    live.sort(key=_queue_key)
    expired.sort(key=_queue_key)

    rows = ledger_math.applicable(ledger, peers)
    reachable = sorted((p for p in peers if p.is_reachable(now_ms, staleness_ms)), key=lambda p: p.peer_id)
    peer_index = {peer.peer_id: index for index, peer in enumerate(reachable)}
    working: dict[BackendKey, Tracked] = {}
    for index, peer in enumerate(reachable):
        for backend in peer.backends:
            if backend.tracked and backend.availability is not None:
                key = (peer.peer_id, backend.backend_id)
                capacity = WorkingCapacity(backend.availability)
                row = rows.get(key)
                if row is not None:
                    capacity.replay(row.reserved)
                working[key] = Tracked(
                    index,
                    peer.peer_id,
                    backend.backend_id,
                    capacity,
                    backend.availability.observation_epoch_ms,
                    backend.availability.total_amounts,
                )

    matches: dict[tuple[Constraint, ...], list[PeerMatch]] = {}
    options: dict[tuple[object, ...], Options] = {}
    promoted = [0] * len(reachable)
    active = [(active_jobs or {}).get(peer.peer_id, 0) for peer in reachable]
    held_before = previous_holds or {}
    open_peers = len(reachable)  # peers still under their cap
    promotions: list[Promotion] = []
    pending: list[Pending] = []
    holds: list[Hold] = []
    queued_reasons: dict[str, str] = {}  # by pin: the same few strings for every job left queued
    gate_tokens: dict[tuple[tuple[str, int], ...], tuple[str, ...]] = {}  # a class is shared across amounts

    def queued_reason(pin: str) -> str:
        reason = queued_reasons.get(pin)
        if reason is None:
            reason = queued_reasons[pin] = reasons.queued(pin)
        return reason

    def match(shape: tuple[Constraint, ...]) -> list[PeerMatch]:
        per_peer = []
        for index, peer in enumerate(reachable):
            ids = sorted(b.backend_id for b in peer.backends if satisfies_all(b.advertised, shape))
            slots = [working.get((peer.peer_id, backend_id)) for backend_id in ids]
            tracked = [slot for slot in slots if slot is not None]
            untracked = [backend_id for backend_id, slot in zip(ids, slots, strict=True) if slot is None]
            per_peer.append(PeerMatch(index, peer.peer_id, tracked, untracked[0] if untracked else None, bool(ids)))
        return per_peer

    def options_of(candidate: Candidate) -> Options:
        tokens = gate_tokens.get(candidate.gate)
        if tokens is None:
            tokens = gate_tokens[candidate.gate] = tuple(token for token, _ in candidate.gate)
        class_key = (_class_fields(candidate), tokens)
        opts = options.get(class_key)
        return opts if opts is not None else build(candidate, class_key, tokens)

    def build(candidate: Candidate, class_key: tuple[object, ...], tokens: tuple[str, ...]) -> Options:
        per_peer = matches.get(candidate.shape)
        if per_peer is None:
            per_peer = matches[candidate.shape] = match(candidate.shape)
        if candidate.pinned_peer_id:
            pinned = peer_index.get(candidate.pinned_peer_id)
            per_peer = [] if pinned is None else [per_peer[pinned]]
        if candidate.avoided_peer_ids:
            per_peer = [peer for peer in per_peer if peer.peer_id not in candidate.avoided_peer_ids]
        opts = options[class_key] = build_options(
            per_peer,
            tokens,
            promoted,
            max_per_peer,
            shapeless=not candidate.shape,
            pin=candidate.pinned_peer_id,
            every_backend=bool(candidate.prefer),
        )
        return opts

    def hold(candidate: Candidate, opts: Options) -> None:
        """An eligible job the pass did not promote holds the backend where it would fit soonest."""
        needs = tuple(need for _, need in candidate.gate)
        failed = opts.hold_failed_at
        if failed is not None and all(n >= f for n, f in zip(needs, failed, strict=True)):
            return  # a smaller gate of this class found nothing to hold: neither will this one
        rank = candidate.band.rank
        chosen = holding.choose(candidate.gate, rank, opts.holdable, held_before.get(candidate.job_id))
        if chosen is None:
            opts.hold_failed_at = needs
            return
        chosen.held_by = candidate.job_id
        available = holding.available_now(chosen, candidate.gate, rank)
        waited_ms = now_ms - candidate.submitted_at_ms
        holds.append(
            Hold(candidate.job_id, chosen.peer_id, chosen.backend_id, dict(candidate.gate), available, waited_ms)
        )

    def eligible(candidate: Candidate) -> bool:
        return holding.eligible(
            candidate.gate, candidate.submitted_at_ms, now_ms=now_ms, reserve_after_ms=reserve_after_ms
        )

    for position, candidate in enumerate(live):
        if not open_peers:  # every peer is at its cap: nothing else can go anywhere this pass
            rest = live[position:]
            pending.extend(Pending(c.job_id, queued_reason(c.pinned_peer_id)) for c in rest)
            if reserve_after_ms:  # but a starving job may still hold a backend
                for starving in rest:
                    if eligible(starving):
                        hold(starving, options_of(starving))
            break
        # The class's options, inlined (this runs once per queued job).
        gate = candidate.gate
        tokens = gate_tokens.get(gate)
        if tokens is None:
            tokens = gate_tokens[gate] = tuple(token for token, _ in gate)
        class_key = (_class_fields(candidate), tokens)
        opts = options.get(class_key)
        if opts is None:
            opts = build(candidate, class_key, tokens)
        choice = (
            choose_gated(candidate, opts, promoted, max_per_peer)
            if gate
            else choose_ungated(candidate, opts, promoted, active, max_per_peer)
        )
        if choice is None:
            pending.append(Pending(candidate.job_id, queued_reason(candidate.pinned_peer_id)))
            if reserve_after_ms and eligible(candidate):
                hold(candidate, opts)
            continue
        if isinstance(choice, Tracked):
            index = choice.peer
            preempts = any(choice.capacity.free.get(token, 0) < need for token, need in gate)
            rank = candidate.band.rank
            for token, need in gate:
                choice.capacity.spend(token, need, rank)
            promotions.append(
                Promotion(candidate.job_id, choice.peer_id, choice.backend_id, preempts, dict(gate), choice.observation)
            )
        else:
            index, peer_id, backend_id = choice
            promotions.append(Promotion(candidate.job_id, peer_id, backend_id, False, {}, None))
        promoted[index] += 1
        if promoted[index] == max_per_peer:
            open_peers -= 1

    # A generator, not a list: a list of 100k charge tuples would live long enough to be promoted
    # to the oldest generation and can set off a full garbage collection.
    charges = (
        ((p.peer_id, p.backend_id), p.observation_epoch_ms, p.reserved)
        for p in promotions
        if p.observation_epoch_ms is not None
    )
    return PlacementResult(
        promotions=tuple(promotions),
        pending=tuple(pending),
        expired=tuple(c.job_id for c in expired),
        ledger=ledger_math.charge(rows, charges),
        remaining={key: slot.capacity for key, slot in working.items()},
        promoted_per_peer={peer.peer_id: promoted[i] for i, peer in enumerate(reachable)},
        holds=tuple(holds),
        reserved={key: dict(row.reserved) for key, row in rows.items() if key in working},
    )


# Candidate.queue_key without the method calls, extracted in C: it runs once per queued job.
_queue_key = attrgetter("band", "submitted_at_ms", "job_id")
# What candidates sharing one list of options share, but for their gated tokens (the amounts differ).
_class_fields = attrgetter("shape", "pinned_peer_id", "band", "avoided_peer_ids", "prefer")

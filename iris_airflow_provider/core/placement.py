"""The placement pass: which queued jobs to promote to which peer backend, on one tick.

Pure: it takes a snapshot (queued candidates, peers as last heartbeated, the reservation ledger,
the clock) and returns decisions; it mutates nothing.

Rules (the reference's ``assign_queued``, plus where DESIGN.md goes beyond it):

- candidates go in queue order: band rank, then submit time, then job id;
- a candidate fits a backend when every routing constraint matches its advertised shape and, for a
  gated job (``replicas x count`` of a concrete GPU variant), the backend's free amount plus what
  strictly lower bands hold there covers the gate. Availability is per backend, never summed;
- best first: a backend whose capacity is visible over a shape-only one; no preemption over
  preemption; the tightest fit; for ungated jobs, the peer with the fewest promotions so far in
  this pass (spreading instead of piling onto one peer); then peer id, then backend id;
- a job never goes to a peer it currently avoids (one that recently failed to take it);
- a pinned job only goes to its peer, and is force-routed there (backend ``""``) when the peer
  advertises no matching backend; so is a job without routing constraints on a peer with no
  backends;
- a full capacity-reporting backend means "wait", never force-routing past it;
- a candidate that fits nowhere stays queued and does not block the ones behind it;
- at most ``max_per_peer`` promotions per peer per pass;
- ledger rows for the current observation are spent before anything is placed;
- a peer past the staleness bound is unreachable; a job past its deadline expires instead.

The pass is indexed, not a scan of every backend for every job: candidates that share a shape,
pin, band and gated tokens share one list of options, built once. Within a pass capacity only ever
decreases and promotion counts only increase, so:

- an upper bound on what a class's options can still offer lets a gated job that cannot fit
  anywhere be skipped in constant time;
- an option on a peer that reached its cap is dropped for good, and once every peer is capped the
  rest of the queue stays queued without being looked at;
- where only one backend of a peer could ever win (for an ungated job's tracked options and any
  job's shape-only ones, the lowest backend id), the list holds only that one.

The tests keep the plain scan as a reference and check both agree; ``bench/placement_bench.py``
times both on large states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from iris_airflow_provider.core import ledger as ledger_math
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.capacity import WorkingCapacity
from iris_airflow_provider.core.constraints import Constraint, satisfies_all
from iris_airflow_provider.core.expiry import past_deadline
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.model import JobSpec

DEFAULT_MAX_HANDOFFS_PER_CYCLE = 8
DEFAULT_HEARTBEAT_STALENESS_MS = 120_000
_UNBOUNDED = 1 << 62


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
    remaining: Mapping[tuple[str, str], WorkingCapacity] = field(default_factory=dict, repr=False)
    promoted_per_peer: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Tracked:
    peer: int
    peer_id: str
    backend_id: str
    capacity: WorkingCapacity
    observation: int


@dataclass(frozen=True, slots=True)
class _PeerMatch:
    """What one shape matches on one reachable peer."""

    index: int
    peer_id: str
    tracked: list[_Tracked]  # matching capacity-reporting backends, by backend id
    shape_only: str | None  # the lowest id of a matching backend without visible capacity, if any
    matched: bool  # whether any backend matches at all


@dataclass(slots=True)
class _Options:
    """Everywhere one class of candidates (same shape, pin, band, gated tokens) could go.

    Both lists only ever shrink: an option on a peer that reached its cap is dropped the next time
    it is seen, since a peer's promotion count never goes down during a pass.
    """

    # Capacity-reporting, shape-matching backends. For an ungated class, only the one with the
    # smallest backend id on each peer: ranked by (promotions on its peer, peer id, backend id),
    # the others there could never be chosen.
    tracked: list[_Tracked]
    # Shape-only targets, one per peer (its smallest matching backend id, or "" to force-route),
    # sorted by peer id: only the first of a peer could ever be chosen, gated or not.
    shape_only: list[tuple[int, str, str]]
    # Per gated token: an upper bound of what any tracked option can still offer.
    bound: dict[str, int]


def plan(
    candidates: Iterable[Candidate],
    peers: Sequence[PeerState],
    ledger: Iterable[LedgerEntry] = (),
    *,
    now_ms: int,
    max_per_peer: int = DEFAULT_MAX_HANDOFFS_PER_CYCLE,
    staleness_ms: int = DEFAULT_HEARTBEAT_STALENESS_MS,
) -> PlacementResult:
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
    working: dict[tuple[str, str], _Tracked] = {}
    for index, peer in enumerate(reachable):
        for backend in peer.backends:
            if backend.tracked and backend.availability is not None:
                key = (peer.peer_id, backend.backend_id)
                capacity = WorkingCapacity(backend.availability)
                row = rows.get(key)
                if row is not None:
                    capacity.replay(row.reserved)
                working[key] = _Tracked(
                    index,
                    peer.peer_id,
                    backend.backend_id,
                    capacity,
                    backend.availability.observation_epoch_ms,
                )

    matches: dict[tuple[Constraint, ...], list[_PeerMatch]] = {}
    options: dict[tuple[object, ...], _Options] = {}
    promoted = [0] * len(reachable)
    open_peers = len(reachable)  # peers still under their cap
    promotions: list[Promotion] = []
    pending: list[Pending] = []
    queued_reasons: dict[str, str] = {}  # by pin: the same few strings for every job left queued
    gate_tokens: dict[tuple[tuple[str, int], ...], tuple[str, ...]] = {}  # a class is shared across amounts

    def queued_reason(pin: str) -> str:
        reason = queued_reasons.get(pin)
        if reason is None:
            reason = queued_reasons[pin] = reasons.queued(pin)
        return reason

    def match(shape: tuple[Constraint, ...]) -> list[_PeerMatch]:
        per_peer = []
        for index, peer in enumerate(reachable):
            ids = sorted(b.backend_id for b in peer.backends if satisfies_all(b.advertised, shape))
            slots = [working.get((peer.peer_id, backend_id)) for backend_id in ids]
            tracked = [slot for slot in slots if slot is not None]
            untracked = [backend_id for backend_id, slot in zip(ids, slots, strict=True) if slot is None]
            per_peer.append(_PeerMatch(index, peer.peer_id, tracked, untracked[0] if untracked else None, bool(ids)))
        return per_peer

    def build(candidate: Candidate) -> _Options:
        per_peer = matches.get(candidate.shape)
        if per_peer is None:
            per_peer = matches[candidate.shape] = match(candidate.shape)
        if candidate.pinned_peer_id:
            pinned = peer_index.get(candidate.pinned_peer_id)
            per_peer = [] if pinned is None else [per_peer[pinned]]
        if candidate.avoided_peer_ids:
            per_peer = [peer for peer in per_peer if peer.peer_id not in candidate.avoided_peer_ids]
        tracked: list[_Tracked] = []
        shape_only: list[tuple[int, str, str]] = []
        for peer in per_peer:
            if promoted[peer.index] >= max_per_peer:
                continue  # capped for the rest of the pass
            tracked += peer.tracked if candidate.gate else peer.tracked[:1]
            if peer.shape_only is not None:
                shape_only.append((peer.index, peer.peer_id, peer.shape_only))
            elif not peer.matched and (not candidate.shape or candidate.pinned_peer_id == peer.peer_id):
                shape_only.append((peer.index, peer.peer_id, ""))  # force-routed
        return _Options(tracked, shape_only, {token: _UNBOUNDED for token, _ in candidate.gate})

    for position, candidate in enumerate(live):
        if not open_peers:  # every peer is at its cap: nothing else can go anywhere this pass
            pending.extend(Pending(c.job_id, queued_reason(c.pinned_peer_id)) for c in live[position:])
            break
        gate = candidate.gate
        tokens = gate_tokens.get(gate)
        if tokens is None:
            tokens = gate_tokens[gate] = tuple(token for token, _ in gate)
        class_key = (candidate.shape, candidate.pinned_peer_id, candidate.band, tokens, candidate.avoided_peer_ids)
        opts = options.get(class_key)
        if opts is None:
            opts = options[class_key] = build(candidate)
        choice = (
            _choose_gated(candidate, opts, promoted, max_per_peer)
            if candidate.gate
            else _choose_ungated(opts, promoted, max_per_peer)
        )
        if choice is None:
            pending.append(Pending(candidate.job_id, queued_reason(candidate.pinned_peer_id)))
            continue
        if isinstance(choice, _Tracked):
            index = choice.peer
            preempts = any(choice.capacity.free.get(token, 0) < need for token, need in candidate.gate)
            for token, need in candidate.gate:
                choice.capacity.spend(token, need, candidate.band.rank)
            promotions.append(
                Promotion(
                    candidate.job_id,
                    choice.peer_id,
                    choice.backend_id,
                    preempts,
                    dict(candidate.gate),
                    choice.observation,
                )
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
    )


# Candidate.queue_key without the method calls, extracted in C: it runs once per queued job.
_queue_key = attrgetter("band", "submitted_at_ms", "job_id")


def _choose_gated(
    candidate: Candidate, opts: _Options, promoted: list[int], cap: int
) -> _Tracked | tuple[int, str, str] | None:
    gate = candidate.gate
    bound = opts.bound
    for token, need in gate:
        if need > bound[token]:  # more than any of the class's options can still offer
            break
    else:
        rank = candidate.band.rank
        best: _Tracked | None = None
        best_key: tuple[bool, int, str, str] | None = None
        ceiling = dict.fromkeys(opts.bound, -1)
        capped = False
        for option in opts.tracked:
            if promoted[option.peer] >= cap:
                capped = True
                continue
            capacity = option.capacity
            fits = True
            preempts = False
            remaining = 0
            for token, need in gate:
                available = capacity.available(token, rank)
                if available > ceiling[token]:
                    ceiling[token] = available
                if available < need:
                    fits = False
                else:
                    remaining += available - need
                    if capacity.free.get(token, 0) < need:
                        preempts = True
            if fits:
                option_key = (preempts, remaining, option.peer_id, option.backend_id)
                if best_key is None or option_key < best_key:
                    best, best_key = option, option_key
        if capped:
            opts.tracked = [option for option in opts.tracked if promoted[option.peer] < cap]
        if best is not None:
            return best
        opts.bound = ceiling
    # The first shape-only target whose peer is under its cap (they are sorted by peer id).
    for position, target in enumerate(opts.shape_only):
        if promoted[target[0]] < cap:
            del opts.shape_only[:position]
            return target
    opts.shape_only.clear()
    return None


def _choose_ungated(opts: _Options, promoted: list[int], cap: int) -> _Tracked | tuple[int, str, str] | None:
    """The peer with the fewest promotions so far (then the lowest peer id), tracked over shape-only."""
    best_tracked: _Tracked | None = None
    fewest = cap
    for tracked in opts.tracked:  # one per peer, sorted by peer id: the first of equals wins
        if promoted[tracked.peer] < fewest:
            best_tracked, fewest = tracked, promoted[tracked.peer]
    if best_tracked is not None:
        return best_tracked
    opts.tracked.clear()  # every peer it could use is capped for the rest of the pass
    best: tuple[int, str, str] | None = None
    for target in opts.shape_only:
        if promoted[target[0]] < fewest:
            best, fewest = target, promoted[target[0]]
    if best is None:
        opts.shape_only.clear()
    return best

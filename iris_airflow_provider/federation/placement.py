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
- a pinned job only goes to its peer, and is force-routed there (backend ``""``) when the peer
  advertises no matching backend; so is a job without routing constraints on a peer with no
  backends;
- a full capacity-reporting backend means "wait", never force-routing past it;
- a candidate that fits nowhere stays queued and does not block the ones behind it;
- at most ``max_per_peer`` promotions per peer per pass;
- ledger rows for the current observation are spent before anything is placed;
- a peer past the staleness bound is unreachable; a job past its deadline expires instead.

The pass is indexed, not a scan of every backend for every job: candidates that share a shape,
pin, band and gated tokens share their list of options, and an upper bound on what those options
can still offer (capacity only ever decreases during a pass) lets a job that cannot fit anywhere be
skipped in constant time. The tests keep the plain scan as a reference and check both agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from iris_airflow_provider.federation import ledger as ledger_math
from iris_airflow_provider.federation import reasons
from iris_airflow_provider.federation.availability import PeerState
from iris_airflow_provider.federation.bands import Band
from iris_airflow_provider.federation.capacity import WorkingCapacity
from iris_airflow_provider.federation.constraints import Constraint, satisfies_all
from iris_airflow_provider.federation.ledger import LedgerEntry
from iris_airflow_provider.federation.model import JobSpec

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

    @classmethod
    def from_job(cls, job: JobSpec, submitted_at_ms: int) -> Candidate:
        return cls(
            job_id=job.job_id,
            band=job.priority_band,
            submitted_at_ms=submitted_at_ms,
            pinned_peer_id=job.pin,
            shape=job.routing,
            gate=tuple(sorted(job.gate.items())),
            deadline_ms=job.scheduling_deadline_ms,
        )

    def queue_key(self) -> tuple[int, int, str]:
        return (self.band.rank, self.submitted_at_ms, self.job_id)

    def expired(self, now_ms: int) -> bool:
        return self.deadline_ms is not None and self.deadline_ms < now_ms


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


@dataclass(frozen=True, slots=True)
class Pending:
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


@dataclass(slots=True)
class _Options:
    """Everywhere one class of candidates (same shape, pin, band, gated tokens) could go."""

    tracked: list[_Tracked]  # capacity-reporting, shape-matching backends
    shape_only: list[tuple[int, str, str]]  # (peer index, peer id, backend id), sorted by ids
    # Per gated token: an upper bound of what any tracked option can still offer.
    bound: dict[str, int]
    shape_only_alive: bool = True


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
    live.sort(key=Candidate.queue_key)
    expired.sort(key=Candidate.queue_key)

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

    matches: dict[tuple[Constraint, ...], list[list[str]]] = {}
    options: dict[tuple[object, ...], _Options] = {}
    promoted = [0] * len(reachable)
    promotions: list[Promotion] = []
    pending: list[Pending] = []

    def build(candidate: Candidate) -> _Options:
        matching = matches.get(candidate.shape)
        if matching is None:
            matching = [
                [b.backend_id for b in peer.backends if satisfies_all(b.advertised, candidate.shape)]
                for peer in reachable
            ]
            matches[candidate.shape] = matching
        if candidate.pinned_peer_id:
            pinned = peer_index.get(candidate.pinned_peer_id)
            allowed = [] if pinned is None else [pinned]
        else:
            allowed = list(range(len(reachable)))
        tracked: list[_Tracked] = []
        shape_only: list[tuple[int, str, str]] = []
        for index in allowed:
            peer_id = reachable[index].peer_id
            for backend_id in matching[index]:
                slot = working.get((peer_id, backend_id))
                if slot is None:
                    shape_only.append((index, peer_id, backend_id))
                else:
                    tracked.append(slot)
            if not matching[index] and (not candidate.shape or candidate.pinned_peer_id == peer_id):
                shape_only.append((index, peer_id, ""))
        shape_only.sort(key=lambda option: (option[1], option[2]))
        huge = 1 << 62
        return _Options(tracked, shape_only, {token: huge for token, _ in candidate.gate})

    for candidate in live:
        class_key = (
            candidate.shape,
            candidate.pinned_peer_id,
            candidate.band,
            tuple(t for t, _ in candidate.gate),
        )
        opts = options.get(class_key)
        if opts is None:
            opts = options[class_key] = build(candidate)
        choice = (
            _choose_gated(candidate, opts, promoted, max_per_peer)
            if candidate.gate
            else _choose_ungated(opts, promoted, max_per_peer)
        )
        if choice is None:
            pending.append(Pending(candidate.job_id, reasons.queued(candidate.pinned_peer_id)))
            continue
        if isinstance(choice, _Tracked):
            preempts = any(choice.capacity.free.get(token, 0) < need for token, need in candidate.gate)
            for token, need in candidate.gate:
                choice.capacity.spend(token, need, candidate.band.rank)
            promoted[choice.peer] += 1
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
            promoted[index] += 1
            promotions.append(Promotion(candidate.job_id, peer_id, backend_id, False, {}, None))

    charges = [
        ((p.peer_id, p.backend_id), p.observation_epoch_ms, p.reserved)
        for p in promotions
        if p.observation_epoch_ms is not None
    ]
    return PlacementResult(
        promotions=tuple(promotions),
        pending=tuple(pending),
        expired=tuple(c.job_id for c in expired),
        ledger=ledger_math.charge(rows, charges),
        remaining={key: slot.capacity for key, slot in working.items()},
        promoted_per_peer={peer.peer_id: promoted[i] for i, peer in enumerate(reachable)},
    )


def _choose_gated(
    candidate: Candidate, opts: _Options, promoted: list[int], cap: int
) -> _Tracked | tuple[int, str, str] | None:
    rank = candidate.band.rank
    gate = candidate.gate
    if all(need <= opts.bound[token] for token, need in gate):
        best: _Tracked | None = None
        best_key: tuple[bool, int, str, str] | None = None
        ceiling = dict.fromkeys(opts.bound, -1)
        for option in opts.tracked:
            if promoted[option.peer] >= cap:
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
        if best is not None:
            return best
        opts.bound = ceiling
    return _first_shape_only(opts, promoted, cap, spread=False)


def _choose_ungated(opts: _Options, promoted: list[int], cap: int) -> _Tracked | tuple[int, str, str] | None:
    best: _Tracked | None = None
    best_key: tuple[int, str, str] | None = None
    for option in opts.tracked:
        count = promoted[option.peer]
        if count >= cap:
            continue
        option_key = (count, option.peer_id, option.backend_id)
        if best_key is None or option_key < best_key:
            best, best_key = option, option_key
    if best is not None:
        return best
    return _first_shape_only(opts, promoted, cap, spread=True)


def _first_shape_only(opts: _Options, promoted: list[int], cap: int, *, spread: bool) -> tuple[int, str, str] | None:
    if not opts.shape_only_alive:
        return None
    best: tuple[int, str, str] | None = None
    best_count = 0
    for option in opts.shape_only:  # sorted by (peer id, backend id)
        count = promoted[option[0]]
        if count >= cap:
            continue
        if not spread:
            return option
        if best is None or count < best_count:
            best, best_count = option, count
    if best is None:
        opts.shape_only_alive = False  # every peer it could use is capped for the rest of the pass
    return best

"""The placement pass's index: where one class of candidates could go, and the choice among it.

Candidates that share a shape, pin, band, gated tokens and avoided peers share one list of options,
built once per pass. Within a pass capacity only ever decreases, promotion counts only increase and
held backends only accumulate, so:

- an upper bound on what a class's options can still offer lets a gated job that cannot fit
  anywhere be skipped in constant time;
- an option on a peer that reached its cap, or on a backend held for a starving job, is dropped for
  good the next time it is seen;
- where only one backend of a peer could ever win (for an ungated job's tracked options, the lowest
  backend id not held; for any job's shape-only ones, the lowest backend id), the list holds only
  that one.

The ranking is :mod:`iris_airflow_provider.core.placement`'s; ``tests/core/reference_placement.py``
restates it as a plain scan, and the tests check both agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from iris_airflow_provider.core.capacity import WorkingCapacity

UNBOUNDED = 1 << 62


class _Band(Protocol):
    @property
    def rank(self) -> int: ...


class GatedCandidate(Protocol):
    """What the choice reads of a candidate (``placement.Candidate``); ungated ones with a preference
    are read the same way."""

    @property
    def gate(self) -> tuple[tuple[str, int], ...]: ...

    @property
    def band(self) -> _Band: ...

    @property
    def prefer(self) -> tuple[str, ...]: ...


@dataclass(slots=True)
class Tracked:
    """A capacity-reporting backend of a reachable peer, as the pass spends it."""

    peer: int  # the peer's index among the reachable peers
    peer_id: str
    backend_id: str
    capacity: WorkingCapacity
    observation: int
    totals: Mapping[str, int]
    held_by: str | None = None  # the starving job holding it in this pass, if any


@dataclass(frozen=True, slots=True)
class PeerMatch:
    """What one shape matches on one reachable peer."""

    index: int
    peer_id: str
    tracked: list[Tracked]  # matching capacity-reporting backends, by backend id
    shape_only: str | None  # the lowest id of a matching backend without visible capacity, if any
    matched: bool  # whether any backend matches at all


@dataclass(slots=True)
class Options:
    """Everywhere one class of candidates (same shape, pin, band, gated tokens) could go.

    The lists only ever shrink: an option on a peer that reached its cap, or held for another job,
    is dropped the next time it is seen.
    """

    # Capacity-reporting, shape-matching backends on peers under their cap. For an ungated class,
    # only the first backend of each peer that is not held (the others could never be chosen);
    # ``spares`` keeps the rest of each peer's, in case that one becomes held.
    tracked: list[Tracked]
    # Shape-only targets, one per peer (its smallest matching backend id, or "" to force-route),
    # sorted by peer id: only the first of a peer could ever be chosen, gated or not.
    shape_only: list[tuple[int, str, str]]
    # Per gated token: an upper bound of what any tracked option can still offer.
    bound: dict[str, int]
    spares: dict[int, list[Tracked]] = field(default_factory=dict)
    # Gated classes: every matching tracked backend, capped peers included: where a starving job
    # may hold capacity (see :mod:`iris_airflow_provider.core.holds`).
    holdable: list[Tracked] = field(default_factory=list)
    # The smallest gate (per token, in gate order) no holdable backend could hold: larger ones skip.
    hold_failed_at: tuple[int, ...] | None = None


def build_options(
    per_peer: Sequence[PeerMatch],
    tokens: Sequence[str],
    promoted: Sequence[int],
    cap: int,
    *,
    shapeless: bool,
    pin: str,
    every_backend: bool = False,
) -> Options:
    """A class's options on ``per_peer`` (already narrowed to its pin and the peers it may use).

    A peer that advertises no matching backend is a force-route target ("") for a job without
    routing constraints, or for a job pinned to it. ``every_backend``: an ungated class tracks every
    backend of a peer, not only its first (a preference may pick any of them).
    """
    gated = bool(tokens)
    tracked: list[Tracked] = []
    spares: dict[int, list[Tracked]] = {}
    holdable: list[Tracked] = []
    shape_only: list[tuple[int, str, str]] = []
    for peer in per_peer:
        if gated:
            holdable += peer.tracked
        if promoted[peer.index] >= cap:
            continue  # capped for the rest of the pass
        if gated or every_backend:
            tracked += peer.tracked
        else:
            free = [option for option in peer.tracked if option.held_by is None]
            tracked += free[:1]
            if len(free) > 1:
                spares[peer.index] = free[1:]
        if peer.shape_only is not None:
            shape_only.append((peer.index, peer.peer_id, peer.shape_only))
        elif not peer.matched and (shapeless or pin == peer.peer_id):
            shape_only.append((peer.index, peer.peer_id, ""))  # force-routed
    return Options(tracked, shape_only, dict.fromkeys(tokens, UNBOUNDED), spares, holdable)


def choose_gated(
    candidate: GatedCandidate, opts: Options, promoted: list[int], cap: int
) -> Tracked | tuple[int, str, str] | None:
    """Best first: no preemption over preemption, the tightest fit, the most room for what it
    prefers, peer id, backend id; a shape-only target only when no tracked one fits."""
    gate = candidate.gate
    prefer = candidate.prefer
    bound = opts.bound
    for token, need in gate:
        if need > bound[token]:  # more than any of the class's options can still offer
            break
    else:
        rank = candidate.band.rank
        best: Tracked | None = None
        best_key: tuple[bool, int, int, str, str] | None = None
        ceiling = dict.fromkeys(opts.bound, -1)
        dropped = False
        for option in opts.tracked:
            if promoted[option.peer] >= cap or option.held_by is not None:
                dropped = True
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
                room = -_room(capacity, prefer, rank) if prefer else 0
                option_key = (preempts, remaining, room, option.peer_id, option.backend_id)
                if best_key is None or option_key < best_key:
                    best, best_key = option, option_key
        if dropped:
            _forget_unusable(opts, promoted, cap)
        if best is not None:
            return best
        opts.bound = ceiling
    return _first_shape_only(opts, promoted, cap) if opts.shape_only else None


def _forget_unusable(opts: Options, promoted: list[int], cap: int) -> None:
    """Drop the options whose peer reached its cap or that a hold took: neither comes back in this pass."""
    opts.tracked = [o for o in opts.tracked if promoted[o.peer] < cap and o.held_by is None]


def _first_shape_only(opts: Options, promoted: list[int], cap: int) -> tuple[int, str, str] | None:
    """The first shape-only target whose peer is under its cap (they are sorted by peer id)."""
    for position, target in enumerate(opts.shape_only):
        if promoted[target[0]] < cap:
            del opts.shape_only[:position]
            return target
    opts.shape_only.clear()
    return None


def choose_ungated(
    candidate: GatedCandidate, opts: Options, promoted: list[int], active: Sequence[int], cap: int
) -> Tracked | tuple[int, str, str] | None:
    """The most room for what the job prefers, if anything (its class then tracks every backend);
    then the least-loaded peer (jobs already in flight there plus this pass's promotions), the
    lowest peer id and backend id (the order of ``opts.tracked``); a tracked backend over a
    shape-only one."""
    prefer = candidate.prefer
    rank = candidate.band.rank
    best: Tracked | None = None
    best_room = best_load = 0
    dropped = False
    for position, option in enumerate(opts.tracked):  # sorted by peer id, then backend id
        peer = option.peer
        if promoted[peer] >= cap:
            dropped = True
            continue
        if option.held_by is not None:
            spare = _next_spare(opts, peer)
            if spare is None:
                dropped = True
                continue
            opts.tracked[position] = option = spare
        room = _room(option.capacity, prefer, rank) if prefer else 0
        load = active[peer] + promoted[peer]
        if best is None or room > best_room or (room == best_room and load < best_load):
            best, best_room, best_load = option, room, load
    if dropped:
        _forget_unusable(opts, promoted, cap)
    if best is not None:
        return best
    return _least_loaded_shape_only(opts, promoted, active, cap)


def _room(capacity: WorkingCapacity, prefer: Sequence[str], rank: int) -> int:
    """How much of the preferred variants a job at ``rank`` could reach on a backend now (free plus
    what lower bands hold, after this pass's spending and the reservations); 0 for one it does not report."""
    return sum(capacity.available(token, rank) for token in prefer)


def _least_loaded_shape_only(
    opts: Options, promoted: list[int], active: Sequence[int], cap: int
) -> tuple[int, str, str] | None:
    """The shape-only target on the peer with the fewest jobs in flight plus promotions, then the
    lowest peer id (they are sorted by peer id)."""
    chosen: tuple[int, str, str] | None = None
    best_load = 0
    for target in opts.shape_only:
        peer = target[0]
        if promoted[peer] < cap and (chosen is None or active[peer] + promoted[peer] < best_load):
            chosen, best_load = target, active[peer] + promoted[peer]
    if chosen is None:
        opts.shape_only.clear()
    return chosen


def _next_spare(opts: Options, peer: int) -> Tracked | None:
    spares = opts.spares.get(peer, [])
    while spares and spares[0].held_by is not None:
        spares.pop(0)
    return spares.pop(0) if spares else None

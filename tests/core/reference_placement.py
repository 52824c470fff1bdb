"""A deliberately simple placement pass: for every candidate, scan every backend of every peer.

It restates the rules as plainly as possible, with its own capacity bookkeeping, so that the
indexed pass in ``placement.py`` can be checked against it on random inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.constraints import satisfies
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import Candidate


def reference_plan(
    candidates: Iterable[Candidate],
    peers: Sequence[PeerState],
    ledger: Iterable[LedgerEntry],
    *,
    now_ms: int,
    max_per_peer: int,
    staleness_ms: int,
    active_jobs: dict[str, int] | None = None,
    previous_holds: dict[str, tuple[str, str]] | None = None,
    reserve_after_ms: int | None = None,
) -> dict:
    candidates = list(candidates)
    expired = sorted((c for c in candidates if c.deadline_ms is not None and c.deadline_ms < now_ms), key=_order)
    live = sorted((c for c in candidates if c.deadline_ms is None or c.deadline_ms >= now_ms), key=_order)

    observation = {}
    for peer in peers:
        for b in peer.backends:
            if b.availability is not None and b.availability.version <= 2:
                observation[(peer.peer_id, b.backend_id)] = b.availability.observation_epoch_ms
    ledger_rows: dict[tuple[str, str], list] = {}
    for row in ledger:
        key = (row.peer_id, row.backend_id)
        if key in observation and row.observation_epoch_ms >= observation[key]:
            epoch, amounts = ledger_rows.get(key, [row.observation_epoch_ms, {}])
            for token, amount in row.reserved.items():
                amounts[token] = amounts.get(token, 0) + amount
            ledger_rows[key] = [max(epoch, row.observation_epoch_ms), amounts]

    reachable = sorted(
        (p for p in peers if p.reachable and now_ms - p.last_contact_ms <= staleness_ms), key=lambda p: p.peer_id
    )
    free: dict[tuple[str, str], dict[str, int]] = {}
    held: dict[tuple[str, str], dict[int, dict[str, int]]] = {}
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for peer in reachable:
        for b in peer.backends:
            key = (peer.peer_id, b.backend_id)
            if key in observation:
                totals[key] = dict(b.availability.total_amounts)
                free[key] = dict(b.availability.amounts)
                held[key] = {band.rank: dict(a) for band, a in b.availability.held_by_band.items()}
                for token, amount in ledger_rows.get(key, [0, {}])[1].items():
                    _spend(free[key], held[key], token, amount, rank=-1)

    promoted = {peer.peer_id: 0 for peer in reachable}
    active = active_jobs or {}
    held_by: dict[tuple[str, str], str] = {}  # backends held for starving jobs so far in this pass
    holds = []
    promotions, pending = [], []
    for c in live:
        rank = c.band.rank
        best = None
        for peer in reachable:
            if c.pinned_peer_id and c.pinned_peer_id != peer.peer_id:
                continue
            if peer.peer_id in c.avoided_peer_ids:
                continue
            if promoted[peer.peer_id] >= max_per_peer:
                continue
            matching = [b for b in peer.backends if all(satisfies(b.advertised, k) for k in c.shape)]
            peer_best = None
            for b in matching:
                key = (peer.peer_id, b.backend_id)
                if key in held_by:
                    continue  # held for a job earlier in the queue
                if key not in free:
                    option = (True, False, 0, 0, b.backend_id)
                else:

                    def reach(t, key=key, rank=rank):
                        return free[key].get(t, 0) + sum(a.get(t, 0) for r, a in held[key].items() if r > rank)

                    available = {t: reach(t) for t, _ in c.gate}
                    if any(available[t] < n for t, n in c.gate):
                        continue
                    preempts = any(free[key].get(t, 0) < n for t, n in c.gate)
                    room = sum(reach(t) for t in c.prefer)  # what it prefers: a tie-break after the fit
                    option = (False, preempts, sum(available[t] - n for t, n in c.gate), -room, b.backend_id)
                if peer_best is None or option < peer_best:
                    peer_best = option
            if peer_best is None and not matching and (not c.shape or c.pinned_peer_id == peer.peer_id):
                peer_best = (True, False, 0, 0, "")
            if peer_best is None:
                continue
            spread = 0 if c.gate else active.get(peer.peer_id, 0) + promoted[peer.peer_id]
            ranked = (*peer_best[:4], spread, peer.peer_id, peer_best[4])
            if best is None or ranked < best:
                best = ranked
        if best is None:
            pending.append(c.job_id)
            eligible = c.gate and reserve_after_ms and now_ms - c.submitted_at_ms > reserve_after_ms
            if eligible:
                hold = _hold(c, reachable, free, held, totals, held_by, (previous_holds or {}).get(c.job_id))
                if hold is not None:
                    held_by[hold[1], hold[2]] = c.job_id
                    holds.append(hold)
            continue
        shape_only, preempts, _, _, _, peer_id, backend_id = best
        key = (peer_id, backend_id)
        promoted[peer_id] += 1
        if not shape_only:
            for t, n in c.gate:
                _spend(free[key], held[key], t, n, rank=rank)
            promotions.append((c.job_id, peer_id, backend_id, preempts, dict(c.gate), observation[key]))
        else:
            promotions.append((c.job_id, peer_id, backend_id, False, {}, None))

    for _, peer_id, backend_id, _, reserved, epoch in promotions:
        if epoch is None or not reserved:
            continue
        key = (peer_id, backend_id)
        row_epoch, amounts = ledger_rows.get(key, [epoch, {}])
        for token, amount in reserved.items():
            amounts[token] = amounts.get(token, 0) + amount
        ledger_rows[key] = [max(row_epoch, epoch), amounts]
    out_ledger = []
    for key in sorted(ledger_rows):
        epoch, amounts = ledger_rows[key]
        amounts = {t: a for t, a in sorted(amounts.items()) if a}
        if amounts:
            out_ledger.append((key[0], key[1], epoch, amounts))
    return {
        "promotions": promotions,
        "pending": pending,
        "expired": [c.job_id for c in expired],
        "ledger": out_ledger,
        "holds": holds,
    }


def _hold(c, reachable, free, held, totals, held_by, previous):
    """(job, peer, backend, needs, available) of the backend a starving job holds, or None."""
    rank = c.band.rank
    options = []
    for peer in reachable:
        if (c.pinned_peer_id and c.pinned_peer_id != peer.peer_id) or peer.peer_id in c.avoided_peer_ids:
            continue
        for b in peer.backends:
            key = (peer.peer_id, b.backend_id)
            if key not in free or key in held_by or not all(satisfies(b.advertised, k) for k in c.shape):
                continue
            total = totals[key]
            if any(t in total and total[t] < n for t, n in c.gate):
                continue  # its total can never hold the job
            available = {
                t: free[key].get(t, 0) + sum(a.get(t, 0) for r, a in held[key].items() if r > rank) for t, _ in c.gate
            }
            covered = sum(min(available[t], n) for t, n in c.gate)
            slack = sum(total[t] - n for t, n in c.gate) if all(t in total for t, _ in c.gate) else float("inf")
            options.append(((-covered, slack, peer.peer_id, b.backend_id), key, available))
    if not options:
        return None
    sticky = [option for option in options if option[1] == previous]
    _, key, available = sticky[0] if sticky else min(options, key=lambda option: option[0])
    return (c.job_id, key[0], key[1], dict(c.gate), available)


def _order(c: Candidate) -> tuple:
    return (c.band.rank, c.submitted_at_ms, c.job_id)


def _spend(free: dict, held: dict, token: str, amount: int, *, rank: int) -> None:
    take = min(free.get(token, 0), amount)
    free[token] = free.get(token, 0) - take
    amount -= take
    for r in sorted(held, reverse=True):  # lowest priority band first
        if amount <= 0 or r <= rank:
            break
        taken = min(held[r].get(token, 0), amount)
        held[r][token] = held[r].get(token, 0) - taken
        amount -= taken


def as_reference_shape(result) -> dict:
    """The indexed pass's result in the reference's plain shape, for comparison."""
    return {
        "promotions": [
            (p.job_id, p.peer_id, p.backend_id, p.preempts, dict(p.reserved), p.observation_epoch_ms)
            for p in result.promotions
        ],
        "pending": [p.job_id for p in result.pending],
        "expired": list(result.expired),
        "ledger": [(r.peer_id, r.backend_id, r.observation_epoch_ms, dict(r.reserved)) for r in result.ledger],
        "holds": [(h.job_id, h.peer_id, h.backend_id, dict(h.needs), dict(h.available)) for h in result.holds],
    }

"""Why a queued job is still waiting, peer by peer and backend by backend.

Read against the capacity left after a placement pass: for each peer, whether it could be used at
all (reachable, fresh, pin, per-tick cap); for each backend, whether the shape matches, what is
free, what the job could reclaim from lower bands, and whether that covers its gate. The summary
says what would have to change for the job to be placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.constraints import satisfies
from iris_airflow_provider.core.placement import Candidate, PlacementResult


def explain(
    candidate: Candidate,
    peers: Sequence[PeerState],
    result: PlacementResult,
    *,
    now_ms: int,
    staleness_ms: int,
    max_per_peer: int,
) -> dict[str, Any]:
    rank = candidate.band.rank
    gate = dict(candidate.gate)
    peer_rows: list[dict[str, Any]] = []
    shape_matches = 0
    best: tuple[int, str, str, int, int] | None = None  # (reachable amount, peer, backend, free, reclaimable)
    blocked_by_cap: list[str] = []
    for peer in sorted(peers, key=lambda p: p.peer_id):
        if candidate.pinned_peer_id and peer.peer_id != candidate.pinned_peer_id:
            continue
        status = "ok"
        if not peer.reachable:
            status = "unreachable"
        elif not peer.is_reachable(now_ms, staleness_ms):
            status = f"stale: last heartbeat {(now_ms - peer.last_contact_ms) // 1000}s ago"
        elif peer.peer_id in candidate.avoided_peer_ids:
            status = "avoided: it could not take this job recently (requeued from it)"
        elif result.promoted_per_peer.get(peer.peer_id, 0) >= max_per_peer:
            status = f"reached {max_per_peer} promotions this tick"
        backends: list[dict[str, Any]] = []
        for backend in peer.backends:
            unmet = [str(c) for c in candidate.shape if not satisfies(backend.advertised, c)]
            row: dict[str, Any] = {
                "backend_id": backend.backend_id,
                "shape_matches": not unmet,
                "unmet": unmet,
            }
            if not backend.tracked:
                row["capacity"] = "not reported (matched on shape alone)"
            else:
                capacity = result.remaining.get((peer.peer_id, backend.backend_id))
                if capacity is not None:
                    free = {t: capacity.free.get(t, 0) for t in gate}
                    reclaimable = {t: capacity.available(t, rank) - capacity.free.get(t, 0) for t in gate}
                    row.update(
                        free=free,
                        reclaimable=reclaimable,
                        fits=all(free[t] + reclaimable[t] >= n for t, n in gate.items()),
                    )
                    if not unmet and status == "ok" and gate:
                        token = next(iter(gate))
                        offer = free[token] + reclaimable[token]
                        if best is None or offer > best[0]:
                            best = (offer, peer.peer_id, backend.backend_id, free[token], reclaimable[token])
            if not unmet and status == "ok":
                shape_matches += 1
            backends.append(row)
        if status.startswith("reached"):
            blocked_by_cap.append(peer.peer_id)
        peer_rows.append({"peer_id": peer.peer_id, "status": status, "backends": backends})
    return {
        "band": candidate.band.wire_name,
        "pinned_peer_id": candidate.pinned_peer_id,
        "gate": gate,
        "constraints": [str(c) for c in candidate.shape],
        "peers": peer_rows,
        "summary": _summary(candidate, peer_rows, shape_matches, best, blocked_by_cap),
    }


def _summary(
    candidate: Candidate,
    peer_rows: list[dict[str, Any]],
    shape_matches: int,
    best: tuple[int, str, str, int, int] | None,
    blocked_by_cap: list[str],
) -> str:
    if candidate.pinned_peer_id and not peer_rows:
        return f"Pinned to peer {candidate.pinned_peer_id}, which is not configured."
    usable = [row for row in peer_rows if row["status"] == "ok"]
    if not usable:
        avoided = [row["peer_id"] for row in peer_rows if row["status"].startswith("avoided")]
        if avoided:
            return (
                f"It was requeued from {', '.join(avoided)}, which it avoids for now, and no other peer it "
                "may use is reachable; it waits for one, or for the avoidance to end."
            )
        if blocked_by_cap:
            capped = ", ".join(blocked_by_cap)
            return f"Every usable peer reached its promotions for this tick ({capped}); it is retried next tick."
        return "No peer it may use is reachable with a fresh heartbeat; it waits for one to report."
    if shape_matches == 0:
        wanted = ", ".join(str(c) for c in candidate.shape)
        return f"No reachable peer advertises a backend matching {wanted}."
    if best is not None:
        token, need = next(iter(candidate.gate))
        offer, peer_id, backend_id, free, reclaimable = best
        return (
            f"Needs {need} {token} on one backend; the most any matching backend offers is {offer} "
            f"({free} free + {reclaimable} reclaimable from lower bands) on {peer_id}/{backend_id}. "
            f"It is placed when {need - offer} more free up there or a peer reports more."
        )
    return "A matching backend exists; it is placed on the next tick that finds it under its per-tick cap."

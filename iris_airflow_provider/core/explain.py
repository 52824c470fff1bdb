"""Why a queued job is still waiting, peer by peer and backend by backend.

Read against the capacity left after a placement pass: for each peer, whether it could be used at
all (reachable, fresh, pin, per-tick cap); for each backend, whether the shape matches, what is
free, what the job could reclaim from lower bands, what is reserved for jobs handed off and not yet
running there, whether a starving job holds it, and whether that covers its gate. The summary says
what would have to change for the job to be placed: nothing can (no matching backend could ever
hold it), the job itself holds a backend and waits for it, another job's hold is in its way, or
how much more must free up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.constraints import satisfies
from iris_airflow_provider.core.fit import never_fits
from iris_airflow_provider.core.holds import Hold, waited
from iris_airflow_provider.core.placement import Candidate, PlacementResult
from iris_airflow_provider.core.reservations import RESERVED_NOTE

# (reachable amount, peer, backend, free, reclaimable, reserved)
_Offer = tuple[int, str, str, int, int, int]


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
    holds = {hold.key: hold for hold in result.holds}
    mine = next((hold for hold in result.holds if hold.job_id == candidate.job_id), None)
    peer_rows: list[dict[str, Any]] = []
    shape_matches = 0
    best: _Offer | None = None
    blocked: Hold | None = None  # another job's hold on a backend this one would fit
    blocked_by_cap: list[str] = []
    for peer in sorted(peers, key=lambda p: p.peer_id):
        if candidate.pinned_peer_id and peer.peer_id != candidate.pinned_peer_id:
            continue
        status = _peer_status(candidate, peer, result, now_ms=now_ms, staleness_ms=staleness_ms, cap=max_per_peer)
        backends: list[dict[str, Any]] = []
        for backend in peer.backends:
            key = (peer.peer_id, backend.backend_id)
            unmet = [str(c) for c in candidate.shape if not satisfies(backend.advertised, c)]
            row: dict[str, Any] = {"backend_id": backend.backend_id, "shape_matches": not unmet, "unmet": unmet}
            hold = holds.get(key)
            if hold is not None:
                row["held_for"] = hold.job_id
                row["hold"] = hold.text()
            reserved = dict(result.reserved.get(key, {}))
            if reserved:
                row["reserved"] = reserved
                row["reserved_note"] = RESERVED_NOTE
            if not backend.tracked:
                row["capacity"] = "not reported (matched on shape alone)"
            elif (capacity := result.remaining.get(key)) is not None:
                free = {t: capacity.free.get(t, 0) for t in gate}
                reclaimable = {t: capacity.available(t, rank) - capacity.free.get(t, 0) for t in gate}
                fits = all(free[t] + reclaimable[t] >= n for t, n in gate.items())
                row.update(free=free, reclaimable=reclaimable, fits=fits)
                if not unmet and status == "ok" and gate:
                    if hold is not None and hold.job_id != candidate.job_id and fits and blocked is None:
                        blocked = hold
                    token = next(iter(gate))
                    offer = free[token] + reclaimable[token]
                    if best is None or offer > best[0]:
                        held = reserved.get(token, 0)
                        best = (offer, peer.peer_id, backend.backend_id, free[token], reclaimable[token], held)
            if not unmet and status == "ok":
                shape_matches += 1
            backends.append(row)
        if status.startswith("reached"):
            blocked_by_cap.append(peer.peer_id)
        peer_rows.append({"peer_id": peer.peer_id, "status": status, "backends": backends})
    too_big = never_fits(
        gate,
        candidate.shape,
        peers=peers,
        pinned_peer_id=candidate.pinned_peer_id,
        now_ms=now_ms,
        staleness_ms=staleness_ms,
    )
    detail: dict[str, Any] = {
        "band": candidate.band.wire_name,
        "pinned_peer_id": candidate.pinned_peer_id,
        "gate": gate,
        "constraints": [str(c) for c in candidate.shape],
        "peers": peer_rows,
        "never_fits": too_big is not None,
    }
    if mine is not None:
        detail["holding"] = {**mine.to_wire(), "text": mine.text()}
    if too_big is not None:
        summary = (
            f"No reachable backend can ever hold it: {too_big.reason(candidate.job_id)}. It stays queued in case "
            "a larger backend reports; cancel it or ask for less."
        )
    else:
        summary = _summary(candidate, peer_rows, shape_matches, best, blocked_by_cap, mine, blocked)
    return {**detail, "summary": summary}


def _peer_status(
    candidate: Candidate, peer: PeerState, result: PlacementResult, *, now_ms: int, staleness_ms: int, cap: int
) -> str:
    if not peer.reachable:
        return "unreachable"
    if not peer.is_reachable(now_ms, staleness_ms):
        return f"stale: last heartbeat {(now_ms - peer.last_contact_ms) // 1000}s ago"
    if peer.peer_id in candidate.avoided_peer_ids:
        return "avoided: it could not take this job recently (requeued from it)"
    if result.promoted_per_peer.get(peer.peer_id, 0) >= cap:
        return f"reached {cap} promotions this tick"
    return "ok"


def _summary(
    candidate: Candidate,
    peer_rows: list[dict[str, Any]],
    shape_matches: int,
    best: _Offer | None,
    blocked_by_cap: list[str],
    mine: Hold | None,
    blocked: Hold | None,
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
    if mine is not None:
        return _holding_summary(mine)
    if blocked is not None:
        return (
            f"It would fit on {blocked.peer_id}/{blocked.backend_id}, but that backend is {blocked.text()}: "
            "no job behind that one in the queue is placed there until it is."
        )
    if best is not None:
        token, need = next(iter(candidate.gate))
        offer, peer_id, backend_id, free, reclaimable, reserved = best
        held = f", after {reserved} {token} {RESERVED_NOTE}" if reserved else ""
        return (
            f"Needs {need} {token} on one backend; the most any matching backend offers is {offer} "
            f"({free} free + {reclaimable} reclaimable from lower bands{held}) on {peer_id}/{backend_id}. "
            f"It is placed when {need - offer} more free up there or a peer reports more."
        )
    return "A matching backend exists; it is placed on the next tick that finds it under its per-tick cap."


def _holding_summary(hold: Hold) -> str:
    """What a job holding a backend waits for."""
    target = f"{hold.peer_id}/{hold.backend_id}"
    parts = [f"{hold.available.get(token, 0)} of its {need} {token}" for token, need in sorted(hold.needs.items())]
    missing = [
        f"{need - hold.available.get(token, 0)} more {token}"
        for token, need in sorted(hold.needs.items())
        if need > hold.available.get(token, 0)
    ]
    until = f"it is placed when {', '.join(missing)} free up there" if missing else "it is placed on the next tick"
    return (
        f"It has waited {waited(hold.waited_ms)}, so it holds {target}, where it would fit soonest: "
        f"{', '.join(parts)} are available there now (free + reclaimable from lower bands). No job behind it in "
        f"the queue is placed there, and {until}."
    )

"""Whether any backend could ever hold a gated job: its gate against the backends' totals.

A backend's ``total_amounts`` is what it could hold if everything else left it. A gated job whose
gate exceeds the total of every matching backend that reports one can never run, and waiting would
not change that: it is rejected at submit, and a job already queued when that became true (totals
shrank, a peer left) says so in its explanation.

"Matching" means satisfying the job's routing constraints on a reachable peer (a fresh heartbeat),
or on a local backend; a pinned job only looks at its pin. A backend without an availability block
(shape only), with a block we do not understand, or without a total for the variant counts as
possibly large enough: then nothing is concluded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from iris_airflow_provider.core.availability import LocalBackend, PeerState
from iris_airflow_provider.core.constraints import Constraint, satisfies_all


@dataclass(frozen=True, slots=True)
class NeverFits:
    """No matching backend can ever hold the job: what it needs, and the largest one there is."""

    need: int
    token: str
    target: str  # "peer/backend", or "local backend <id>"
    total: int

    def reason(self, job_id: str) -> str:
        return (
            f"Job {job_id} needs {self.need} {self.token} on one backend; "
            f"the largest that can host it is {self.target} with {self.total} in total"
        )


def _targets(
    routing: Sequence[Constraint],
    peers: Sequence[PeerState],
    local_backends: Sequence[LocalBackend],
    *,
    pinned_peer_id: str,
    now_ms: int,
    staleness_ms: int,
) -> list[tuple[str, Mapping[str, int] | None]]:
    """Every matching backend, with its totals (None: it reports none we can read)."""
    targets: list[tuple[str, Mapping[str, int] | None]] = []
    if not pinned_peer_id:
        for local in local_backends:
            if satisfies_all(local.advertised, routing):
                targets.append((f"local backend {local.backend_id}", local.total_amounts))
    for peer in sorted(peers, key=lambda p: p.peer_id):
        if pinned_peer_id and peer.peer_id != pinned_peer_id:
            continue
        if not peer.is_reachable(now_ms, staleness_ms):
            continue
        for backend in sorted(peer.backends, key=lambda b: b.backend_id):
            if satisfies_all(backend.advertised, routing):
                totals = backend.availability.total_amounts if backend.tracked and backend.availability else None
                targets.append((f"{peer.peer_id}/{backend.backend_id}", totals))
    return targets


def never_fits(
    gate: Mapping[str, int],
    routing: Sequence[Constraint],
    *,
    peers: Sequence[PeerState],
    local_backends: Sequence[LocalBackend] = (),
    pinned_peer_id: str = "",
    now_ms: int,
    staleness_ms: int,
) -> NeverFits | None:
    """Why no matching backend could ever hold ``gate``; None when one might, or none matches at all."""
    if not gate:
        return None
    targets = _targets(
        routing, peers, local_backends, pinned_peer_id=pinned_peer_id, now_ms=now_ms, staleness_ms=staleness_ms
    )
    if not targets:
        return None  # nothing matches: the shape rules decide
    short: list[tuple[str, Mapping[str, int]]] = []
    for target, totals in targets:
        if totals is None or all(token not in totals or totals[token] >= need for token, need in gate.items()):
            return None  # possibly large enough
        short.append((target, totals))
    # Name the first of the job's tokens that some backend lacks, and the largest backend by it.
    token = next(t for t in sorted(gate) if any(t in totals and totals[t] < gate[t] for _, totals in short))
    total, target = max(((totals.get(token, 0), target) for target, totals in short), key=lambda item: item[0])
    return NeverFits(gate[token], token, target, total)

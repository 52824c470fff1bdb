"""Submit-time classification of a whole job: LOCAL, QUEUE (maybe pinned), or REJECT.

Exactly the reference's ``PeerRouter.classify``, in this order:

1. a pin (``target_cluster`` or ``cluster EQ``) queues for that peer, even when the job could run
   locally; the pin is checked against configuration, not against what the peer advertises
   (beyond the reference: unless that peer is reachable and every matching backend there reports
   a total too small for the job's gate, see below);
2. a job some local backend could host runs LOCAL;
3. a job some reachable peer could host (one backend satisfying every routing constraint; any
   reachable peer when there are none) queues, with no peer chosen;
4. anything else is rejected now instead of wedging in a queue.

Beyond the reference, a gated job that no matching backend could ever hold (its gate exceeds the
``total_amounts`` of every matching backend that reports totals, locally and on every reachable
peer: :mod:`iris_airflow_provider.core.fit`) is rejected instead of queued, naming its need and
the largest backend there is.

Only root jobs federate: a child that would queue is refused, naming ``target_cluster`` on the root
as the remedy. Placement is never decided here; the tick does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from iris_airflow_provider.core.availability import LocalBackend, PeerState
from iris_airflow_provider.core.constraints import Advertised, Constraint, satisfies, satisfies_all
from iris_airflow_provider.core.fit import never_fits
from iris_airflow_provider.core.model import JobSpec


class Disposition(StrEnum):
    LOCAL = "local"
    QUEUE = "queue"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Decision:
    disposition: Disposition
    pinned_peer_id: str = ""
    reason: str = ""
    local_backend_id: str = ""

    def to_wire(self, job_id: str) -> dict[str, str]:
        return {
            "job_id": job_id,
            "disposition": self.disposition.value,
            "pinned_peer_id": self.pinned_peer_id,
            "reason": self.reason,
        }


def peer_can_host(peer: PeerState, routing: Sequence[Constraint]) -> bool:
    """Some single backend satisfies every routing constraint (attributes are never combined)."""
    if not routing:
        return True
    return any(satisfies_all(backend.advertised, routing) for backend in peer.backends)


def local_backends_for(job: JobSpec, local_backends: Sequence[LocalBackend]) -> list[LocalBackend]:
    """The local backends this job could run on (a ``backend`` pin narrows the choice to one)."""
    pin = job.backend_pin
    candidates = [b for b in local_backends if not pin or b.backend_id == pin]
    routing, gate = job.routing, job.gate
    return [b for b in candidates if b.could_host(routing, gate)]


def classify(
    job: JobSpec,
    *,
    local_backends: Sequence[LocalBackend],
    peers: Sequence[PeerState],
    now_ms: int,
    staleness_ms: int,
) -> Decision:
    pin = job.pin
    if pin:
        if pin not in {peer.peer_id for peer in peers}:
            return Decision(
                Disposition.REJECT,
                reason=f"Job {job.job_id} pins cluster {pin!r}, which is not a configured federation peer.",
            )
        if job.backend_pin:
            return Decision(Disposition.REJECT, reason=f"Job {job.job_id} pins both a backend and a cluster")
        too_big = never_fits(
            job.gate, job.routing, peers=peers, pinned_peer_id=pin, now_ms=now_ms, staleness_ms=staleness_ms
        )
        if too_big is not None:
            return Decision(Disposition.REJECT, pinned_peer_id=pin, reason=too_big.reason(job.job_id))
        return _queue(job, pinned_peer_id=pin)
    hosts = local_backends_for(job, local_backends)
    if hosts:
        return Decision(Disposition.LOCAL, local_backend_id=hosts[0].backend_id)
    routing = job.routing
    if any(peer.is_reachable(now_ms, staleness_ms) and peer_can_host(peer, routing) for peer in peers):
        too_big = never_fits(
            job.gate,
            routing,
            peers=peers,
            local_backends=[b for b in local_backends if not job.backend_pin or b.backend_id == job.backend_pin],
            now_ms=now_ms,
            staleness_ms=staleness_ms,
        )
        if too_big is not None:
            return Decision(Disposition.REJECT, reason=too_big.reason(job.job_id))
        return _queue(job, pinned_peer_id="")
    return Decision(
        Disposition.REJECT,
        reason=unschedulable_reason(
            job, local_backends=local_backends, peers=peers, now_ms=now_ms, staleness_ms=staleness_ms
        ),
    )


def _queue(job: JobSpec, *, pinned_peer_id: str) -> Decision:
    if not job.is_root:
        return Decision(
            Disposition.REJECT,
            pinned_peer_id=pinned_peer_id,
            reason=(
                f"Job {job.job_id} is not a root job: only whole root jobs federate, and a job tree "
                f"lives on one cluster. Set target_cluster on the root job {job.root_job_id} to run "
                "its whole tree on a peer."
            ),
        )
    return Decision(Disposition.QUEUE, pinned_peer_id=pinned_peer_id)


def _first_unmet(advertised: Advertised, constraints: Sequence[Constraint]) -> str:
    for constraint in constraints:
        if not satisfies(advertised, constraint):
            values = advertised.get(constraint.key)
            shown = ", ".join(str(v) for v in values) if values else "nothing"
            return f"needs {constraint}, advertises {constraint.key}={shown}"
    return ""


def unschedulable_reason(
    job: JobSpec,
    *,
    local_backends: Sequence[LocalBackend],
    peers: Sequence[PeerState],
    now_ms: int,
    staleness_ms: int,
) -> str:
    """Why no local backend or peer can host ``job``, and what each of them advertises."""
    routing, gate = job.routing, job.gate
    constraints = ", ".join(str(c) for c in routing) or "none"
    lines = [f"Job {job.job_id} is unschedulable: no local backend or peer can host it (constraints: {constraints})."]
    if job.backend_pin and not any(b.backend_id == job.backend_pin for b in local_backends):
        lines.append(f"It pins local backend {job.backend_pin!r}, which this cluster does not have.")
    for backend in local_backends:
        if job.backend_pin and backend.backend_id != job.backend_pin:
            continue
        unmet = _first_unmet(backend.advertised, routing)
        if not unmet and backend.total_amounts:
            short = {t: n for t, n in gate.items() if backend.total_amounts.get(t, 0) < n}
            unmet = "; ".join(
                f"needs {n} {t}, has {backend.total_amounts.get(t, 0)} in total" for t, n in short.items()
            )
        lines.append(f"Local backend {backend.backend_id}: {unmet or 'cannot host it'}.")
    if not local_backends:
        lines.append("This cluster has no local backends.")
    if not peers:
        lines.append("No federation peers are configured.")
    for peer in peers:
        if not peer.reachable:
            lines.append(f"Peer {peer.peer_id}: unreachable.")
        elif not peer.is_reachable(now_ms, staleness_ms):
            age = (now_ms - peer.last_contact_ms) // 1000
            lines.append(f"Peer {peer.peer_id}: last heartbeat {age}s ago, past the {staleness_ms // 1000}s bound.")
        elif not peer.backends:
            lines.append(f"Peer {peer.peer_id}: advertises no backends.")
        else:
            for peer_backend in peer.backends:
                unmet = _first_unmet(peer_backend.advertised, routing)
                lines.append(f"Peer {peer.peer_id} backend {peer_backend.backend_id}: {unmet}.")
    return " ".join(lines)

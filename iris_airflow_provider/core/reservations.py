"""Capacity handed off and not yet visible: what this cluster's jobs in flight still reserve on a peer.

A peer backend advertises what its admitted work holds; a job delivered there but still waiting in
its queue (a Kueue-suspended Job, a process backend at ``max_running_jobs``) holds nothing, so the
peer goes on advertising that capacity as free, heartbeat after heartbeat. Without a reservation
every tick would promote another job onto it.

The rule, exact and explainable: a job promoted to a backend reserves its gate there until

- it is reported holding capacity there (accepted or running) *and* the backend's numbers in use
  were asked for after that report arrived (so they include it), or
- it ends, or it is moved away (requeued): it is no longer in flight.

A newer observation that does not yet include the job never releases it. Both times are this
cluster's clock: ``holding_since_ms`` when the report arrived, the peer's ``observed_after_ms``
when the heartbeat whose numbers are in use was asked for. So a peer that reports truthfully is
never counted twice for longer than one heartbeat after the job shows up there.

A force-routed job (no backend chosen) or one on a shape-only backend reserves nothing: there are
no numbers to subtract from. Every job in flight counts towards its peer's load, whatever its shape
(ungated jobs spread by it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.ledger import BackendKey, LedgerEntry, current_observations

RESERVED_NOTE = "reserved for jobs handed off and not yet running there"


@dataclass(frozen=True, slots=True)
class InFlight:
    """A job this cluster handed (or is handing) to a peer, not finished."""

    job_id: str
    peer_id: str
    backend_id: str  # "" when force-routed
    gate: Mapping[str, int] = field(default_factory=dict)
    holding_since_ms: int | None = None  # when a report first said it holds capacity there (our clock)

    def reserves(self, observed_after_ms: int | None) -> bool:
        """Whether its gate is still reserved against numbers asked for at ``observed_after_ms``."""
        if not self.gate or not self.backend_id:
            return False
        if self.holding_since_ms is None:
            return True
        # Strictly after: numbers asked for in the same millisecond may predate the report.
        return observed_after_ms is None or observed_after_ms <= self.holding_since_ms


def in_force(in_flight: Iterable[InFlight], peers: Iterable[PeerState]) -> dict[BackendKey, list[InFlight]]:
    """The jobs still reserving capacity on each capacity-reporting backend, in job id order."""
    peers = list(peers)
    observed_after = {peer.peer_id: peer.observed_after_ms for peer in peers}
    tracked = current_observations(peers)
    out: dict[BackendKey, list[InFlight]] = {}
    for job in sorted(in_flight, key=lambda j: j.job_id):
        key = (job.peer_id, job.backend_id)
        if key in tracked and job.reserves(observed_after.get(job.peer_id)):
            out.setdefault(key, []).append(job)
    return out


def reserved_amounts(jobs: Iterable[InFlight]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for job in jobs:
        total.update(job.gate)
    return {token: amount for token, amount in sorted(total.items()) if amount}


def as_ledger(in_flight: Iterable[InFlight], peers: Iterable[PeerState]) -> list[LedgerEntry]:
    """The reservations in force as ledger rows at each backend's current observation, which the
    placement pass spends before it places anything."""
    peers = list(peers)
    observations = current_observations(peers)
    rows = []
    for key, jobs in sorted(in_force(in_flight, peers).items()):
        amounts = reserved_amounts(jobs)
        if amounts:
            rows.append(LedgerEntry(key[0], key[1], observations[key], amounts))
    return rows


def active_jobs(in_flight: Iterable[InFlight]) -> dict[str, int]:
    """Jobs in flight per peer: the load ungated jobs spread by."""
    return dict(Counter(job.peer_id for job in in_flight if job.peer_id))


def reserved_note(amounts: Mapping[str, int], jobs: int) -> str:
    """``8 h100 reserved for jobs handed off and not yet running there (1 job)``."""
    shown = ", ".join(f"{amount} {token}" for token, amount in sorted(amounts.items()))
    return f"{shown} {RESERVED_NOTE} ({jobs} job{'s' if jobs != 1 else ''})"

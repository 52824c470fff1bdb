"""What one placement pass reads, in one value: the queued candidates, the peers as last
heartbeated, the jobs in flight (what they still reserve, and each peer's load), last tick's holds
and the time. The tick places from it, and a pending job's explanation replays the same pass from
it, so both always see the same inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from iris_airflow_provider.core import reservations
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.ledger import BackendKey, LedgerEntry
from iris_airflow_provider.core.placement import Candidate, PlacementResult, plan
from iris_airflow_provider.core.reservations import InFlight


@dataclass(frozen=True, slots=True)
class PlacementRules:
    max_per_peer: int  # promotions per peer per tick
    staleness_ms: int  # a heartbeat older than this counts as unknown
    reserve_after_ms: int | None = None  # a gated job waiting longer holds a backend (None, 0: never)


@dataclass(frozen=True, slots=True)
class PlacementSnapshot:
    candidates: tuple[Candidate, ...]
    peers: tuple[PeerState, ...]
    ledger: tuple[LedgerEntry, ...]  # rows given as such (simulate); the tick's come from ``in_flight``
    now_ms: int
    in_flight: tuple[InFlight, ...] = ()
    holds: Mapping[str, BackendKey] = field(default_factory=dict)  # job id -> backend it held last tick


def place(snapshot: PlacementSnapshot, rules: PlacementRules) -> PlacementResult:
    """The placement pass over ``snapshot``."""
    return plan(
        snapshot.candidates,
        snapshot.peers,
        (*snapshot.ledger, *reservations.as_ledger(snapshot.in_flight, snapshot.peers)),
        now_ms=snapshot.now_ms,
        max_per_peer=rules.max_per_peer,
        staleness_ms=rules.staleness_ms,
        active_jobs=reservations.active_jobs(snapshot.in_flight),
        previous_holds=snapshot.holds,
        reserve_after_ms=rules.reserve_after_ms,
    )

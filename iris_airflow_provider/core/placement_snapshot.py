"""What one placement pass reads, in one value: the queued candidates, the peers as last
heartbeated, the reservation ledger and the time. The tick places from it, and a pending job's
explanation replays the same pass from it, so both always see the same inputs."""

from __future__ import annotations

from dataclasses import dataclass

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import Candidate, PlacementResult, plan


@dataclass(frozen=True, slots=True)
class PlacementRules:
    max_per_peer: int  # promotions per peer per tick
    staleness_ms: int  # a heartbeat older than this counts as unknown


@dataclass(frozen=True, slots=True)
class PlacementSnapshot:
    candidates: tuple[Candidate, ...]
    peers: tuple[PeerState, ...]
    ledger: tuple[LedgerEntry, ...]
    now_ms: int


def place(snapshot: PlacementSnapshot, rules: PlacementRules) -> PlacementResult:
    """The placement pass over ``snapshot``."""
    return plan(
        snapshot.candidates,
        snapshot.peers,
        snapshot.ledger,
        now_ms=snapshot.now_ms,
        max_per_peer=rules.max_per_peer,
        staleness_ms=rules.staleness_ms,
    )

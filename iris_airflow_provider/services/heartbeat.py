"""Peers' heartbeats: asking each configured peer for its backends, and the peers as last heard from.

Every tick asks every peer. At submit, only peers without a fresh heartbeat are asked, and each at
most once per cooldown (see :mod:`iris_airflow_provider.core.grace`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.grace import may_probe_stale_peer
from iris_airflow_provider.peers.base import Peer
from iris_airflow_provider.services.fanout import each_peer
from iris_airflow_provider.services.placement import configured_peer_states
from iris_airflow_provider.services.ports import HeartbeatStore


@dataclass(eq=False)  # a service, compared by identity
class Heartbeats:
    store: HeartbeatStore
    _: KW_ONLY
    peers: Mapping[str, Peer]
    clock: Callable[[], int]
    timeout_s: float
    staleness_ms: int

    def all(self) -> dict[str, str]:
        """Heartbeat every configured peer and forget the others; peer -> ``ok`` or the error."""
        outcome = self.record(self.peers)
        self.store.forget_peers(self.peers)
        return outcome

    def record(self, peers: Mapping[str, Peer]) -> dict[str, str]:
        """Ask each peer for its backends and store the answer (or that it did not answer), with when
        it was asked: every number in an answer was measured after that (see core/reservations.py)."""
        asked = self.clock()
        results = each_peer(peers, lambda peer: peer.heartbeat(), self.timeout_s)
        self.store.record_heartbeats(results, self.clock(), asked_at_ms=asked)  # one transaction
        return {
            peer_id: str(result) if isinstance(result, BaseException) else "ok" for peer_id, result in results.items()
        }

    def refresh_stale(self) -> bool:
        """Ask the peers without a fresh heartbeat for one now, unless they were asked lately.
        Returns whether any peer was asked."""
        now = self.clock()
        records = {record.peer_id: record for record in self.store.peers()}
        stale = {}
        for peer_id, peer in self.peers.items():
            record = records.get(peer_id)
            fresh = record is not None and record.is_reachable(now, self.staleness_ms)
            if may_probe_stale_peer(
                fresh=fresh, last_attempt_ms=record.last_attempt_ms if record else None, now_ms=now
            ):
                stale[peer_id] = peer
        if stale:
            self.record(stale)
        return bool(stale)

    def configured_states(self) -> list[PeerState]:
        """The configured peers as last heartbeated (a peer never heard from is unreachable)."""
        return configured_peer_states(self.store, self.peers)

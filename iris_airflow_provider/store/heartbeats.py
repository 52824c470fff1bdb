"""Peers as their heartbeats leave them: reachability, last contact, and each backend's advertised
attributes and availability block, read back as the core's
:class:`~iris_airflow_provider.core.availability.PeerState`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.availability import PeerBackend, PeerState
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.wire import AvailabilityBlock
from iris_airflow_provider.store.common import StoreBase, insert
from iris_airflow_provider.store.records import BackendRecord, PeerRecord
from iris_airflow_provider.store.schema import capacity_holds, peer_backends, peers


class Heartbeats(StoreBase):
    def record_heartbeat(
        self,
        peer_id: str,
        now_ms: int,
        backends: Sequence[PeerBackend] | None,
        *,
        error: str = "",
        asked_at_ms: int | None = None,
    ) -> None:
        """Store a peer's heartbeat, answered at ``now_ms`` to a call made at ``asked_at_ms`` (default:
        ``now_ms``): its backends replace the previous ones. ``None``: the call failed, the peer
        becomes unreachable and its last known backends are kept."""
        answer: Sequence[PeerBackend] | BaseException = backends if backends is not None else Exception(error)
        self.record_heartbeats({peer_id: answer}, now_ms, asked_at_ms=now_ms if asked_at_ms is None else asked_at_ms)

    def record_heartbeats(
        self, answers: Mapping[str, Sequence[PeerBackend] | BaseException], now_ms: int, *, asked_at_ms: int
    ) -> None:
        """:meth:`record_heartbeat` for each peer's answer (its backends, or why the call failed), in
        one transaction: the peers that answered in one statement each for the peers, their old
        backends and their new ones; a failed call on its own (its error is its own)."""
        answered = {peer_id: answer for peer_id, answer in answers.items() if not isinstance(answer, BaseException)}
        with self._write() as connection:
            for peer_id, answer in answers.items():
                if isinstance(answer, BaseException):
                    _record_unreachable(connection, peer_id, now_ms, str(answer))
            if not answered:
                return
            values = _reached(now_ms, asked_at_ms)
            upsert = insert(connection, peers).on_conflict_do_update(index_elements=["peer_id"], set_=values)
            connection.execute(upsert, [{"peer_id": peer_id, **values} for peer_id in answered])
            connection.execute(peer_backends.delete().where(peer_backends.c.peer_id.in_(list(answered))))
            rows = [_backend_row(peer_id, b, now_ms) for peer_id, backends in answered.items() for b in backends]
            if rows:
                connection.execute(peer_backends.insert(), rows)

    def forget_peers(self, keep: Iterable[str]) -> None:
        """Drop peers (and the holds on their backends) that are no longer configured."""
        keep = list(keep)
        with self._write() as connection:
            connection.execute(peers.delete().where(peers.c.peer_id.not_in(keep)))
            connection.execute(capacity_holds.delete().where(capacity_holds.c.peer_id.not_in(keep)))

    def peers(self) -> list[PeerRecord]:
        with self._read() as connection:
            peer_rows = connection.execute(sa.select(peers).order_by(peers.c.peer_id)).mappings().all()
            backend_rows = (
                connection.execute(sa.select(peer_backends).order_by(peer_backends.c.backend_id)).mappings().all()
            )
        by_peer: dict[str, list[BackendRecord]] = {}
        for row in backend_rows:
            by_peer.setdefault(row["peer_id"], []).append(
                BackendRecord(
                    row["backend_id"],
                    row["kind"],
                    row["attributes"],
                    row["availability"],
                    row["observation_epoch_ms"],
                    row["received_at_ms"],
                )
            )
        return [
            PeerRecord(
                row["peer_id"],
                row["reachable"],
                row["last_contact_ms"],
                row["last_attempt_ms"],
                row["last_error"],
                tuple(by_peer.get(row["peer_id"], ())),
                row["unreachable_since_ms"],
                row["observed_after_ms"],
            )
            for row in peer_rows
        ]

    def peer_states(self) -> list[PeerState]:
        """Peers as the core sees them: reachability, last contact, backends with availability."""
        return [
            PeerState(
                record.peer_id,
                record.reachable,
                record.last_contact_ms or 0,
                tuple(_peer_backend(backend) for backend in record.backends),
                record.observed_after_ms,
            )
            for record in self.peers()
        ]


def _backend_row(peer_id: str, backend: PeerBackend, now_ms: int) -> dict[str, Any]:
    availability = backend.availability
    return {
        "peer_id": peer_id,
        "backend_id": backend.backend_id,
        "kind": backend.kind,
        "attributes": {k: list(v) for k, v in backend.advertised.items()},
        "availability": availability.to_wire() if availability else None,
        "observation_epoch_ms": availability.observation_epoch_ms if backend.tracked and availability else None,
        "received_at_ms": now_ms,
    }


def _peer_backend(record: BackendRecord) -> PeerBackend:
    """A stored backend as the core sees it; its block is read back as the wire shape it was stored in."""
    block = record.availability
    availability = AvailabilityBlock.model_validate(block).to_core() if block is not None else None
    return PeerBackend(record.backend_id, normalize_advertised(record.attributes), availability, record.kind)


def _record_unreachable(connection: sa.Connection, peer_id: str, now_ms: int, error: str) -> None:
    """A heartbeat call failed: the peer is unreachable, its last known backends are kept."""
    values = {"reachable": False, "last_attempt_ms": now_ms, "last_error": error}
    # Unreachable since its first unanswered heartbeat (kept while it stays unreachable).
    since = sa.func.coalesce(peers.c.unreachable_since_ms, now_ms)
    connection.execute(
        insert(connection, peers)
        .values(peer_id=peer_id, unreachable_since_ms=now_ms, **values)
        .on_conflict_do_update(index_elements=["peer_id"], set_={**values, "unreachable_since_ms": since})
    )


def _reached(now_ms: int, observed_after_ms: int) -> dict[str, Any]:
    """A peer's columns once it answered a heartbeat call made at ``observed_after_ms``."""
    return {
        "reachable": True,
        "last_attempt_ms": now_ms,
        "last_error": "",
        "last_contact_ms": now_ms,
        "observed_after_ms": observed_after_ms,
        "unreachable_since_ms": None,
    }

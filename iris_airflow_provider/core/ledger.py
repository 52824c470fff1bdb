"""The reservation ledger: capacity already spoken for on a peer backend, which the placement pass
spends before it places anything, and its arithmetic.

A row reserves amounts against a backend's observation (``observation_epoch_ms``): it applies while
the backend reports that observation (or, if the peer's clock went backwards, an older one) and
drops once a strictly newer one arrives. That is the whole rule for the rows ``simulate`` takes in
and gives back (one pass, nothing known of the jobs behind them). The tick builds its rows from the
jobs it has in flight instead (:mod:`iris_airflow_provider.core.reservations`), always at the
backend's current observation: there a reservation lasts until the peer's reports show its job,
not merely until a newer observation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from iris_airflow_provider.core.availability import PeerState

BackendKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    peer_id: str
    backend_id: str
    observation_epoch_ms: int
    reserved: Mapping[str, int]

    @property
    def key(self) -> BackendKey:
        return (self.peer_id, self.backend_id)

    def to_wire(self) -> dict[str, object]:
        return {
            "peer_id": self.peer_id,
            "backend_id": self.backend_id,
            "observation_epoch_ms": self.observation_epoch_ms,
            "reserved": dict(self.reserved),
        }


def current_observations(peers: Iterable[PeerState]) -> dict[BackendKey, int]:
    """The observation each capacity-reporting backend is at now."""
    return {
        (peer.peer_id, backend.backend_id): backend.availability.observation_epoch_ms
        for peer in peers
        for backend in peer.backends
        if backend.tracked and backend.availability is not None
    }


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for token, amount in amounts.items():
        into[token] = into.get(token, 0) + amount


def applicable(entries: Iterable[LedgerEntry], peers: Iterable[PeerState]) -> dict[BackendKey, LedgerEntry]:
    """Rows still in force, merged per backend; rows for absent backends or older observations drop."""
    observed = current_observations(peers)
    merged: dict[BackendKey, tuple[int, dict[str, int]]] = {}
    for entry in entries:
        current = observed.get(entry.key)
        if current is None or entry.observation_epoch_ms < current:
            continue
        epoch, amounts = merged.get(entry.key, (entry.observation_epoch_ms, {}))
        _add(amounts, entry.reserved)
        merged[entry.key] = (max(epoch, entry.observation_epoch_ms), amounts)
    return {key: LedgerEntry(key[0], key[1], epoch, amounts) for key, (epoch, amounts) in merged.items()}


def _charged(
    held: tuple[int, dict[str, int]] | None, observation_epoch_ms: int, reserved: Mapping[str, int]
) -> tuple[int, dict[str, int]]:
    """The charge rule on ``(observation, amounts)``; ``held``'s amounts are updated in place."""
    if held is None or held[0] < observation_epoch_ms:
        # Reserved against an older observation: spent, as the newer one reflects its jobs.
        return observation_epoch_ms, dict(reserved)
    epoch, amounts = held  # the same observation, or a newer one (the peer's clock went backwards)
    _add(amounts, reserved)
    return epoch, amounts


def charged(
    held: LedgerEntry | None, key: BackendKey, observation_epoch_ms: int, reserved: Mapping[str, int]
) -> LedgerEntry:
    """One backend's reservations ``held`` (None: none) after charging ``reserved`` against
    ``observation_epoch_ms``: an entry from a strictly older observation is spent and the charge
    replaces it; otherwise the charge adds to it, and it keeps the newer observation."""
    current = (held.observation_epoch_ms, dict(held.reserved)) if held is not None else None
    epoch, amounts = _charged(current, observation_epoch_ms, reserved)
    return LedgerEntry(key[0], key[1], epoch, amounts)


def charge(
    rows: Mapping[BackendKey, LedgerEntry], reservations: Iterable[tuple[BackendKey, int, Mapping[str, int]]]
) -> tuple[LedgerEntry, ...]:
    """Rows plus new ``(backend, observation, reserved)`` charges (see :func:`charged`); sorted,
    without zero amounts."""
    merged: dict[BackendKey, tuple[int, dict[str, int]]] = {
        key: (row.observation_epoch_ms, dict(row.reserved)) for key, row in rows.items()
    }
    for key, observation, reserved in reservations:
        if reserved:
            merged[key] = _charged(merged.get(key), observation, reserved)
    out = []
    for key in sorted(merged):
        epoch, amounts = merged[key]
        nonzero = {token: amount for token, amount in sorted(amounts.items()) if amount}
        if nonzero:
            out.append(LedgerEntry(key[0], key[1], epoch, nonzero))
    return tuple(out)

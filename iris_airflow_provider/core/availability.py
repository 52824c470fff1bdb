"""What peers and local backends advertise: shape, free capacity per band, reachability.

The availability block mirrors the seed's wire shape (``version``, ``observation_epoch_ms``,
``amounts``, ``total_amounts``, ``held_by_band``). A backend without a block, or with a block of a
version newer than we understand, is matched on shape alone: we never act on numbers whose
meaning we do not know.

``observation_epoch_ms`` names the observation the numbers belong to, and our backends keep it while
their numbers stay the same (:func:`settled`): a heartbeat that repeats the same free, total and
held amounts is the same observation, not a newer one. A parent that resets its reservations on a
newer observation (the reference) is then not invited to spend the same capacity again every
heartbeat; when the numbers change, so does the epoch. How fresh the numbers are is the
heartbeat's own time (``last_contact_ms``), not the epoch's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import Advertised, Constraint, satisfies_all

# v1: free amounts only. v2: free counts only what admitted work holds, plus ``held_by_band``.
AVAILABILITY_METRIC_VERSION = 2


@dataclass(frozen=True, slots=True)
class Availability:
    version: int
    observation_epoch_ms: int
    amounts: Mapping[str, int]
    total_amounts: Mapping[str, int] = field(default_factory=dict)
    held_by_band: Mapping[Band, Mapping[str, int]] = field(default_factory=dict)

    @property
    def understood(self) -> bool:
        return self.version <= AVAILABILITY_METRIC_VERSION

    def same_numbers(self, other: Availability) -> bool:
        """Whether ``other`` reports exactly these numbers (its epoch aside)."""
        return type(other) is type(self) and replace(other, observation_epoch_ms=self.observation_epoch_ms) == self

    def to_wire(self) -> dict[str, object]:
        return {
            "version": self.version,
            "observation_epoch_ms": self.observation_epoch_ms,
            "amounts": dict(self.amounts),
            "total_amounts": dict(self.total_amounts),
            "held_by_band": [
                {"band": band.wire_name, "amounts": dict(amounts)}
                for band, amounts in sorted(self.held_by_band.items(), key=lambda item: item[0].rank)
            ],
        }


@dataclass(frozen=True, slots=True)
class PeerBackend:
    backend_id: str
    advertised: Advertised
    availability: Availability | None = None
    kind: str = ""  # e.g. "process", "kubernetes"; display only

    @property
    def tracked(self) -> bool:
        """Whether the parent can see this backend's capacity (else: matched on shape alone)."""
        return self.availability is not None and self.availability.understood


@dataclass(frozen=True, slots=True)
class PeerState:
    """A peer as of its last heartbeat."""

    peer_id: str
    reachable: bool
    last_contact_ms: int
    backends: tuple[PeerBackend, ...] = ()
    # When this cluster asked for the heartbeat these numbers come from (its own clock): they were
    # measured after it. None: not known, so no reservation is taken as visible in them.
    observed_after_ms: int | None = None

    def is_reachable(self, now_ms: int, staleness_ms: int) -> bool:
        """Reachable and heard from within the staleness bound; stale numbers are unknown, not free."""
        return self.reachable and now_ms - self.last_contact_ms <= staleness_ms


def settled(previous: Availability | None, current: Availability) -> Availability:
    """``current``, keeping ``previous``'s epoch when the numbers are the same: an unchanged report
    is the same observation (see the module docstring)."""
    if previous is not None and previous.same_numbers(current):
        return replace(current, observation_epoch_ms=previous.observation_epoch_ms)
    return current


@dataclass(frozen=True, slots=True)
class LocalBackend:
    """A backend of this cluster, for submit-time feasibility.

    ``total_amounts`` is what the backend could ever host; ``None`` means it does not say, and
    only its shape is checked.
    """

    backend_id: str
    advertised: Advertised
    total_amounts: Mapping[str, int] | None = None

    def could_host(self, routing: tuple[Constraint, ...], gate: Mapping[str, int]) -> bool:
        if not satisfies_all(self.advertised, routing):
            return False
        if not self.total_amounts:
            return True
        return all(self.total_amounts.get(token, 0) >= amount for token, amount in gate.items())

"""Big jobs must not starve: a gated job that has waited long enough holds the backend where it would
fit soonest, and nothing behind it in the queue is placed there until it is.

Without it a 32-GPU job behind a steady stream of 8-GPU jobs waits for ever: whenever 8 GPUs free
up, a small job takes them. The rules (beyond the reference, which only skips what cannot fit):

- a job is *eligible* when it is gated and has waited longer than ``reserve_after_ms``
  (``now_ms - submitted_at_ms > reserve_after_ms``; None or 0 turns holding off);
- when the placement pass reaches an eligible job that it does not promote, the job holds one
  matching backend not yet held in this pass: a capacity-reporting backend of a reachable peer it
  may use (its pin; not one it avoids) whose total can hold its gate (or that reports no total for
  the variant). The one with the most of its gate available now (free plus what lower bands hold
  there, each token counted up to its need), then the tightest (least total beyond the gate; an
  unknown total last), then peer id, then backend id. A job that held a backend on the last tick
  keeps it while it is still such a backend, so a hold does not wander as numbers move elsewhere;
- while held, no job later in the queue is promoted onto that backend (earlier ones may be);
- each backend holds for at most one job, each job holds at most one backend; a hold ends when its
  job is promoted, leaves the queue, or the backend stops matching (every pass decides anew, from
  the holds of the last one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from iris_airflow_provider.core.ledger import BackendKey
from iris_airflow_provider.core.placement_index import Tracked


@dataclass(frozen=True, slots=True)
class Hold:
    """A backend held for a starving job, with what the job needs and what is available there now."""

    job_id: str
    peer_id: str
    backend_id: str
    needs: Mapping[str, int]
    available: Mapping[str, int]
    waited_ms: int

    @property
    def key(self) -> BackendKey:
        return (self.peer_id, self.backend_id)

    def text(self) -> str:
        return holding_text(self.peer_id, self.backend_id, self.job_id, self.waited_ms)

    def to_wire(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "peer_id": self.peer_id,
            "backend_id": self.backend_id,
            "needs": dict(self.needs),
            "available": dict(self.available),
        }


def holding_text(peer_id: str, backend_id: str, job_id: str, waited_ms: int) -> str:
    """``holding cw-h100/default for /alice/big (waiting 41 min)``"""
    return f"holding {peer_id}/{backend_id} for {job_id} (waiting {waited(waited_ms)})"


def waited(ms: int) -> str:
    """``12 s``, ``41 min``, ``3 h 5 min``."""
    seconds = max(0, ms) // 1000
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 100:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def eligible(
    gate: Sequence[tuple[str, int]], submitted_at_ms: int, *, now_ms: int, reserve_after_ms: int | None
) -> bool:
    """Gated, and waiting longer than ``reserve_after_ms`` (None or 0: holding is off)."""
    return bool(gate) and bool(reserve_after_ms) and now_ms - submitted_at_ms > (reserve_after_ms or 0)


def can_hold(option: Tracked, gate: Sequence[tuple[str, int]]) -> bool:
    """Its total could hold the gate (a token without a total counts as possibly large enough)."""
    totals = option.totals
    return all(token not in totals or totals[token] >= need for token, need in gate)


def _rank(option: Tracked, gate: Sequence[tuple[str, int]], rank: int) -> tuple[int, int, str, str]:
    """Smaller is better: most of the gate available, tightest total, peer id, backend id."""
    covered = sum(min(option.capacity.available(token, rank), need) for token, need in gate)
    totals = option.totals
    slack = sum(totals[token] - need for token, need in gate) if all(token in totals for token, _ in gate) else 1 << 62
    return (-covered, slack, option.peer_id, option.backend_id)


def choose(
    gate: Sequence[tuple[str, int]], rank: int, options: Sequence[Tracked], previous: BackendKey | None
) -> Tracked | None:
    """The backend a starving job holds among ``options`` (those not held yet and able to hold it)."""
    usable = [option for option in options if option.held_by is None and can_hold(option, gate)]
    if previous is not None:
        for option in usable:
            if (option.peer_id, option.backend_id) == previous:
                return option
    return min(usable, key=lambda option: _rank(option, gate, rank), default=None)


def available_now(option: Tracked, gate: Sequence[tuple[str, int]], rank: int) -> dict[str, int]:
    return {token: option.capacity.available(token, rank) for token, _ in gate}

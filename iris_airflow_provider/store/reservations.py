"""What this cluster's jobs in flight reserve on peers, read from the jobs themselves.

A sent job pending delivery or handed off, not finished, is in flight on its peer: it counts
towards that peer's load, and its gate stays reserved on its backend until the peer's reports show
it (the rule is the core's, :mod:`iris_airflow_provider.core.reservations`). The reservation needs
no write of its own: the promotion's compare-and-set makes it, the job's end or requeue ends it,
and a report that the job holds capacity there (``holding_since_ms``, set by the mirror) lets the
next heartbeat release it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.reservations import InFlight
from iris_airflow_provider.core.resources import Resources
from iris_airflow_provider.core.states import Direction, HandoffState
from iris_airflow_provider.store.common import StoreBase, not_terminal
from iris_airflow_provider.store.schema import jobs

IN_FLIGHT_HANDOFFS = (HandoffState.PENDING.value, HandoffState.HANDED_OFF.value)


def gate_of(spec: Mapping[str, Any]) -> dict[str, int]:
    """A stored spec's gate, from its resources alone (cheaper than validating the whole spec)."""
    return Resources.model_validate(spec.get("resources") or {}).gate()


class Reservations(StoreBase):
    def in_flight_handoffs(self) -> list[InFlight]:
        """Sent jobs promoted or handed off to a peer and not finished, by job id."""
        query = (
            sa.select(jobs.c.job_id, jobs.c.peer_id, jobs.c.backend_id, jobs.c.spec, jobs.c.holding_since_ms)
            .where(
                jobs.c.direction == Direction.SENT.value,
                jobs.c.handoff_state.in_(IN_FLIGHT_HANDOFFS),
                jobs.c.peer_id != "",
                not_terminal(),
            )
            .order_by(jobs.c.job_id)
        )
        with self._read() as connection:
            rows = connection.execute(query).all()
        return [
            InFlight(job_id, peer_id, backend_id, gate_of(spec), holding)
            for job_id, peer_id, backend_id, spec, holding in rows
        ]

"""``iris-federation simulate``: one JSON state in, the federation's decisions out.

The input describes this cluster's local backends, the peers as last heartbeated (each with the
jobs this cluster already has in flight there, ``active_jobs``), the jobs being submitted, the
reservation ledger and, optionally, how long a gated job waits before it may hold a backend
(``reserve_after_ms``); the output gives each job's submit-time disposition, the promotions one
tick would make, the exact pending reason of every job left queued (with an explanation), the
expired jobs, the ledger after the tick and the backends held for starving jobs
(``reservations``). Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, Strict, ValidationError, field_validator

from iris_airflow_provider.core.availability import (
    LocalBackend,
    PeerState,
)
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.explain import explain
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.names import unique_by
from iris_airflow_provider.core.placement import (
    DEFAULT_HEARTBEAT_STALENESS_MS,
    DEFAULT_MAX_HANDOFFS_PER_CYCLE,
    Candidate,
    plan,
)
from iris_airflow_provider.core.router import Disposition, classify
from iris_airflow_provider.core.strict_model import StrictModel
from iris_airflow_provider.core.wire import Amounts, AttributeValues, BackendSummary, amounts_validator

Count = Annotated[int, Strict(), Field(ge=0)]  # JSON integers only: not "3", 3.0 or true


class PeerIn(StrictModel):
    peer_id: str = Field(min_length=1)
    reachable: bool = True
    last_contact_ms: int = Field(ge=0)
    backends: list[BackendSummary] = Field(default_factory=list)
    # Jobs this cluster already has in flight on the peer: ungated jobs spread by them.
    active_jobs: Count = 0

    _unique_backends = field_validator("backends")(unique_by("backend_id"))

    def to_core(self) -> PeerState:
        return PeerState(self.peer_id, self.reachable, self.last_contact_ms, tuple(b.to_core() for b in self.backends))


class LocalBackendIn(StrictModel):
    backend_id: str = Field(min_length=1)
    advertised_attributes: dict[str, AttributeValues] = Field(default_factory=dict)
    total_amounts: Amounts | None = None

    _check_amounts = amounts_validator("total_amounts")

    def to_core(self) -> LocalBackend:
        return LocalBackend(self.backend_id, normalize_advertised(self.advertised_attributes), self.total_amounts)


class SimulatedJob(JobSpec):
    submitted_at_ms: int = Field(ge=0)


class LedgerRowIn(StrictModel):
    peer_id: str = Field(min_length=1)
    backend_id: str = Field(min_length=1)
    observation_epoch_ms: int = Field(ge=0)
    reserved: Amounts = Field(default_factory=dict)

    _check_amounts = amounts_validator("reserved")


class SimulateInput(StrictModel):
    now_ms: int = Field(ge=0)
    max_handoffs_per_cycle: int = Field(default=DEFAULT_MAX_HANDOFFS_PER_CYCLE, ge=1)
    # A gated job waiting longer than this holds the backend where it would fit soonest (null, 0: never).
    reserve_after_ms: Count | None = None
    heartbeat_staleness_ms: int = Field(default=DEFAULT_HEARTBEAT_STALENESS_MS, ge=0)
    local_backends: list[LocalBackendIn] = Field(default_factory=list)
    peers: list[PeerIn] = Field(default_factory=list)
    jobs: list[SimulatedJob] = Field(default_factory=list)
    ledger: list[LedgerRowIn] = Field(default_factory=list)

    _unique_local = field_validator("local_backends")(unique_by("backend_id"))

    _unique_peers = field_validator("peers")(unique_by("peer_id"))

    _unique_jobs = field_validator("jobs")(unique_by("job_id"))


def parse_input(document: Any) -> SimulateInput:
    try:
        return SimulateInput.model_validate(document)
    except ValidationError as error:
        raise SpecError.from_validation_error(error) from None


def simulate(document: Any, *, include_explanations: bool = True) -> dict[str, Any]:
    """Run classification and one placement pass over ``document``; raise :class:`SpecError` if invalid."""
    state = parse_input(document)
    peers = [p.to_core() for p in state.peers]
    local_backends = [b.to_core() for b in state.local_backends]
    decisions = []
    candidates = []
    for job in state.jobs:
        decision = classify(
            job,
            local_backends=local_backends,
            peers=peers,
            now_ms=state.now_ms,
            staleness_ms=state.heartbeat_staleness_ms,
        )
        decisions.append(decision.to_wire(job.job_id))
        if decision.disposition is Disposition.QUEUE:
            candidates.append(Candidate.from_job(job, job.submitted_at_ms))
    ledger = [LedgerEntry(r.peer_id, r.backend_id, r.observation_epoch_ms, r.reserved) for r in state.ledger]
    result = plan(
        candidates,
        peers,
        ledger,
        now_ms=state.now_ms,
        max_per_peer=state.max_handoffs_per_cycle,
        staleness_ms=state.heartbeat_staleness_ms,
        active_jobs={p.peer_id: p.active_jobs for p in state.peers},
        reserve_after_ms=state.reserve_after_ms,
    )
    by_id = {c.job_id: c for c in candidates}
    pending: list[dict[str, Any]] = []
    for entry in result.pending:
        row: dict[str, Any] = {"job_id": entry.job_id, "reason": entry.reason}
        if include_explanations:
            row["explanation"] = explain(
                by_id[entry.job_id],
                peers,
                result,
                now_ms=state.now_ms,
                staleness_ms=state.heartbeat_staleness_ms,
                max_per_peer=state.max_handoffs_per_cycle,
            )
        pending.append(row)
    return {
        "decisions": decisions,
        "promotions": [p.to_wire() for p in result.promotions],
        "pending": pending,
        "expired": list(result.expired),
        "ledger": [row.to_wire() for row in result.ledger],
        "reservations": [hold.to_wire() for hold in result.holds],
    }

"""Submitting a whole root job: classify it (LOCAL, QUEUE, REJECT), enqueue it or start it here.

Placement is never decided here: a queued job waits for the tick. A job submitted right after a
restart, before the first tick, is classified again after asking stale peers, so it is not
rejected for want of a heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    Backend,
    JobReport,
    Submission,
    SubmissionRefusedError,
)
from iris_airflow_provider.core.availability import LocalBackend
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.ownership import may_claim, taken
from iris_airflow_provider.core.router import Decision, Disposition, classify
from iris_airflow_provider.core.states import Direction, HandoffState
from iris_airflow_provider.services.heartbeat import Heartbeats
from iris_airflow_provider.services.ports import SubmitStore
from iris_airflow_provider.store.records import JobRecord, NewIncarnation, Origin, owner_of

log = logging.getLogger(__name__)

# Who a job submitted by an unauthenticated or in-cluster caller is accountable to; never federated.
LOCAL_ADMIN = "local_admin"


class IdentityError(ValueError):
    """A job that would federate has no accountable submitter."""


@dataclass(frozen=True, slots=True)
class Submitted:
    decision: Decision
    job: JobRecord | None  # None when rejected
    reattached: bool = False  # a live job with this id already existed: nothing new was submitted


@dataclass(eq=False)  # a service, compared by identity
class Submitter:
    store: SubmitStore
    _: KW_ONLY
    default_region: str
    backends: Mapping[str, Backend]
    heartbeats: Heartbeats
    clock: Callable[[], int]
    apply_report: Callable[[JobRecord, JobReport], bool]
    # What every launched job gets to call back (its api-server's URL and a job token), by job key
    # and nonce (services/job_tokens.py); None where this cluster issues no job tokens.
    job_env: Callable[[str, str], Mapping[str, str]] | None = None

    def local_backends(self) -> list[LocalBackend]:
        described = [backend.describe() for backend in self.backends.values()]
        return [
            LocalBackend(b.backend_id, b.advertised, dict(b.availability.total_amounts) if b.availability else None)
            for b in described
        ]

    def classify(self, spec: JobSpec) -> Decision:
        """Classify on what the peers last said; a job that would be rejected is classified again
        after asking stale peers. Local and queued jobs never wait for a peer."""
        decision = self._classify(spec)
        if decision.disposition is Disposition.REJECT and self.heartbeats.refresh_stale():
            decision = self._classify(spec)
        return decision

    def _classify(self, spec: JobSpec) -> Decision:
        return classify(
            spec,
            local_backends=self.local_backends(),
            peers=self.heartbeats.configured_states(),
            now_ms=self.clock(),
            staleness_ms=self.heartbeats.staleness_ms,
        )

    def submit(
        self, spec: JobSpec, *, submitting_user: str, origin: Origin | None = None, owner_principal: str = ""
    ) -> Submitted:
        """Classify a whole job and enqueue it (QUEUE), start it here (LOCAL), or say why not (REJECT).

        Idempotent per job id, for the job's owner (its DAG, task and user): while the job is live,
        submitting it again reattaches to it; once it has finished, submitting runs it again as a
        new incarnation. Anyone else naming the id gets ``OwnershipError``, and nothing is written.
        """
        spec = spec.with_default_region(self.default_region)
        claimant = owner_of(origin, submitting_user)
        existing = self.store.get_job(spec.job_id)
        if existing is not None and not may_claim(existing.owner, claimant):
            raise taken(spec.job_id)
        if existing is not None and not existing.terminal:
            return Submitted(_decision_of(existing), existing, reattached=True)
        decision = self.classify(spec)
        if decision.disposition is Disposition.REJECT:
            return Submitted(decision, None)
        if decision.disposition is Disposition.QUEUE and submitting_user in ("", LOCAL_ADMIN):
            raise IdentityError(
                f"Job {spec.job_id} would run on a peer cluster, which needs an accountable submitter, "
                "and this run has none: trigger it as a logged-in user (UI or REST API), or set "
                "submitter='someone@example.com' on the operator for scheduled runs."
            )
        local = decision.disposition is Disposition.LOCAL
        new = NewIncarnation(
            spec,
            direction=Direction.LOCAL if local else Direction.SENT,
            submitting_user=submitting_user,
            owner_principal=owner_principal or submitting_user,
            peer_id=decision.pinned_peer_id,
            backend_id=decision.local_backend_id,
            origin=origin,
        )
        if existing is not None:
            record = self.store.reincarnate(new, self.clock())
        else:
            admission = self.store.admit(new, self.clock())
            record = admission.job if admission.created else None
        if record is None:  # submitted again between our read and our write: join it if it is ours
            current = self.store.get_job(spec.job_id)
            if current is not None and not may_claim(current.owner, claimant):
                raise taken(spec.job_id)
            return Submitted(_decision_of(current) if current else decision, current, reattached=True)
        if local:
            self.start_local(record, spec)
            record = self.store.get_job(spec.job_id) or record
        log.info("Job %s: %s", spec.job_id, _decision_text(decision))
        return Submitted(decision, record)

    def start_received(self, job_id: str, nonce: str) -> JobRecord:
        """Start a job a peer handed us on the backend chosen at admission (idempotent by nonce)."""
        record = self.store.get_job(job_id)
        if record is None or record.direction is not Direction.RECEIVED or record.nonce != nonce:
            raise KeyError(f"Job {job_id} (incarnation {nonce}) was not handed to this cluster, or was replaced")
        if not record.terminal:
            self.start_local(record, record.job_spec)
        return self.store.get_job(job_id) or record

    def start_local(self, record: JobRecord, spec: JobSpec) -> None:
        """Hand ``record`` to its local backend and mirror the first report."""
        backend = self.backends[record.backend_id]
        job_env = self.job_env(record.job_id, record.nonce) if self.job_env else {}
        submission = Submission(record.job_id, record.nonce, spec, record.peer_id, record.submitted_at_ms, job_env)
        try:
            report = backend.submit(submission).report
        except (SubmissionRefusedError, AlreadyExistsError) as error:
            self.store.fail_start(record.job_id, record.nonce, str(error), self.clock())
            return
        current = self.store.get_job(record.job_id)
        if current is not None and current.nonce == record.nonce and current.cancel_requested:
            backend.cancel(record.job_id)  # a cancel landed while we were starting it: honour it
        self.apply_report(record, report)


def _decision_of(job: JobRecord) -> Decision:
    if job.direction is Direction.SENT:
        return Decision(
            Disposition.QUEUE, pinned_peer_id=job.peer_id if job.handoff_state is HandoffState.QUEUED else ""
        )
    return Decision(Disposition.LOCAL, local_backend_id=job.backend_id)


def _decision_text(decision: Decision) -> str:
    if decision.disposition is Disposition.LOCAL:
        return f"runs locally on backend {decision.local_backend_id}"
    if decision.pinned_peer_id:
        return f"queued for peer {decision.pinned_peer_id}"
    return "queued for a federation peer"

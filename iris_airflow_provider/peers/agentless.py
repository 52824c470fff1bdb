"""A peer without an agent: the parent drives the peer's backends directly (a process backend in the
demo and tests, a Kubernetes cluster through its API in production)."""

from __future__ import annotations

from collections.abc import Sequence

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    Backend,
    InsufficientCapacityError,
    JobReport,
    LogChunk,
    Submission,
    SubmissionRefusedError,
)
from iris_airflow_provider.core.availability import PeerBackend
from iris_airflow_provider.core.constraints import satisfies_all
from iris_airflow_provider.core.job_report import projected
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode, SyncResult, Termination
from iris_airflow_provider.peers.identity import submitter_admitted


class AgentlessPeer:
    kind = "agentless"
    address = ""

    def __init__(self, peer_id: str, backends: Sequence[Backend], *, allowed_submitters: Sequence[str] = ()) -> None:
        if not backends:
            raise ValueError(f"peer {peer_id} needs at least one backend")
        self.peer_id = peer_id
        self.backends = {backend.backend_id: backend for backend in backends}
        self.allowed_submitters = list(allowed_submitters)

    def heartbeat(self) -> list[PeerBackend]:
        try:
            return [backend.describe() for backend in self.backends.values()]
        except OSError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"cannot read peer {self.peer_id}: {error}") from error

    def _backend_for(self, handoff: Handoff) -> Backend:
        chosen = self.backends.get(handoff.backend_id)
        if chosen is not None:
            return chosen
        # Force-routed (or the backend went away): the first backend whose shape fits, else the first.
        routing = handoff.spec.routing
        for backend in self.backends.values():
            if satisfies_all(backend.describe().advertised, routing):
                return backend
        return next(iter(self.backends.values()))

    def deliver(self, handoff: Handoff) -> JobReport:
        # The admission an Airflow peer applies to itself; with no agent there, the parent applies it.
        if not submitter_admitted(self.allowed_submitters, handoff.submitting_user):
            raise PeerError(
                PeerErrorCode.PERMISSION_DENIED,
                f"Submitter {handoff.submitting_user!r} is not admitted for federation to this cluster "
                f"(allowed_submitters of peer {self.peer_id} in the cluster file)",
            )
        backend = self._backend_for(handoff)
        submission = projected(handoff, Submission)
        try:
            return backend.submit(submission).report
        except AlreadyExistsError as error:
            raise PeerError(PeerErrorCode.ALREADY_EXISTS, str(error)) from error
        except InsufficientCapacityError as error:
            raise PeerError(PeerErrorCode.RESOURCE_EXHAUSTED, str(error)) from error
        except SubmissionRefusedError as error:
            raise PeerError(PeerErrorCode.INVALID_ARGUMENT, str(error)) from error
        except OSError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id}: {error}") from error

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        reports: dict[str, JobReport] = {}
        try:
            for backend in self.backends.values():
                for job_id in job_ids:
                    if job_id not in reports and (report := backend.status(job_id)) is not None:
                        reports[job_id] = report
        except OSError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id}: {error}") from error
        return SyncResult(reports, frozenset(job_ids) - reports.keys(), cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        try:
            if nonce:  # only that incarnation: a later one of the same job may run here now
                reports = (backend.status(job_id) for backend in self.backends.values())
                if not any(report is not None and report.nonce == nonce for report in reports):
                    return False
            return any(backend.cancel(job_id) for backend in self.backends.values())
        except OSError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id}: {error}") from error

    def terminate(self, job_id: str, nonce: str) -> Termination:
        try:
            for backend in self.backends.values():
                report = backend.status(job_id)
                if report is None or report.nonce != nonce:
                    continue
                if not report.state.terminal:
                    backend.cancel(job_id)
                    report = backend.status(job_id)
                ended = report is None or report.nonce != nonce or report.state.terminal
                return Termination.ENDED if ended else Termination.STOPPING
        except OSError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id}: {error}") from error
        return Termination.NOT_FOUND

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        for backend in self.backends.values():
            if backend.status(job_id) is not None:
                return backend.logs(job_id, cursor, max_lines)
        return LogChunk((), cursor)

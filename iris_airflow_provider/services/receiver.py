"""The peer side of federation: what this cluster does with jobs other clusters hand it.

A handoff is authorized as a peer-to-peer delivery, not as a user submission: the caller's signed
identity must be the requester it names, and the submitting user it asserts must be admitted by
this cluster's ``allowed_submitters``. No client-freshness style gate is applied (the parent
already gated its user). The job is admitted under the parent's job id, kept here in the
requester's namespace (``<requester>:<job id>``, so peers' ids never meet each other's or local
ones), idempotently by (requester, nonce), runs on a local backend and never re-federates. The parent then pulls what
changed (``sync``), may cancel (``terminate``) and read logs, but only for jobs it handed off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import sqlalchemy as sa

from iris_airflow_provider.backends.base import Backend, ReplicaReport, now_ms
from iris_airflow_provider.backends.bundles import bundle_limit
from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.constraints import satisfies_all
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.job_report import ChildReport
from iris_airflow_provider.core.job_tree import parent_key, root_key
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.ownership import received_job_key, wire_job_id
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.core.wire import BackendSummary
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import submitter_admitted
from iris_airflow_provider.peers.wire import (
    MAX_CHILDREN,
    MAX_ERROR_CHARS,
    SYNC_RESULTS_BUDGET,
    BackendsResponse,
    HandoffRequest,
    HandoffResponse,
    JobStatus,
    LogsResponse,
    SyncResponse,
)
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.settings import ClusterSettings
from iris_airflow_provider.services.submit import LOCAL_ADMIN
from iris_airflow_provider.store.records import JobRecord, NewIncarnation
from iris_airflow_provider.store.store import FederationStore

log = logging.getLogger(__name__)

# Events are numbered when written but may become visible out of order (concurrent commits):
# every sync re-reads this many events before the cursor. Deltas are whole job states, so a
# repeated one is harmless.
SYNC_OVERLAP = 500
# Jobs per answer; a parent further behind catches up over several syncs. Far above the overlap,
# so that each answer gets past the jobs it re-reads.
SYNC_LIMIT = 10_000


def _as_roots(changes: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Changed jobs as the roots they belong to (each once, at its newest change), oldest first."""
    newest: dict[str, int] = {}
    for key, seq in changes:
        root = root_key(key)
        newest[root] = max(seq, newest.get(root, 0))
    return sorted(newest.items(), key=lambda item: item[1])


def job_status(
    job: JobRecord,
    backends: Mapping[str, Backend] | None = None,
    result: str | None = None,
    tree: Sequence[JobRecord] | None = None,
    serving_urls: Mapping[str, str] | None = None,
) -> JobStatus:
    """A received job as the peer API reports it to its requester (under the id the requester knows);
    with ``backends``, its replicas as the backend running it sees them; with ``result``, what it
    handed back (as this cluster's store keeps it); with ``tree``, the children it submitted here
    (and theirs), which the requester mirrors as part of it; with ``serving_urls``, where this cluster
    serves its named ports (minted here: the requester shows them, it mints none)."""
    replicas: tuple[ReplicaReport, ...] | None = None  # None: as last reported
    backend = (backends or {}).get(job.backend_id)
    if backend is not None:
        try:
            report = backend.status(job.job_id)
        except Exception as error:  # the job's own state is in the store; replicas are extra detail
            log.info("Could not read the replicas of %s: %s", job.job_id, error)
            report = None
        if report is not None and report.nonce == job.nonce:
            replicas = report.replicas
    report = job.report(replicas)
    children = None if tree is None else tuple(_child_report(job.peer_id, child) for child in tree[:MAX_CHILDREN])
    return JobStatus.of(
        replace(
            report,
            job_id=wire_job_id(job.peer_id, job.job_id),
            result=result,
            children=children,
            serving_urls=serving_urls,
        )
    )


def _child_report(requester: str, child: JobRecord) -> ChildReport:
    error = child.error if len(child.error) <= MAX_ERROR_CHARS else child.error[: MAX_ERROR_CHARS - 6] + " [cut]"
    return ChildReport(
        wire_job_id(requester, child.job_id),
        child.state,
        child.exit_code,
        error,
        child.started_at_ms,
        child.finished_at_ms,
    )


class Receiver:
    def __init__(
        self,
        federation: Federation,
        *,
        start_run: Callable[[JobRecord], None],
        clock: Callable[[], int] = now_ms,
        serving_urls: Callable[[JobRecord], Mapping[str, str]] | None = None,
    ) -> None:
        self.federation = federation
        self.config: ClusterSettings = federation.config
        self.store: FederationStore = federation.store
        self.backends: Mapping[str, Backend] = federation.backends
        self.start_run = start_run
        self.clock = clock
        self.mint_serving_urls = serving_urls  # services/serving.py's Serving.urls, where this cluster mints

    # Heartbeat ---------------------------------------------------------------------------------

    def describe(self) -> BackendsResponse:
        return BackendsResponse(
            cluster=self.config.name,
            backends=[BackendSummary.of(backend.describe()) for backend in self.backends.values()],
        )

    # Handoff -----------------------------------------------------------------------------------

    def handoff(self, caller: str, request: HandoffRequest) -> HandoffResponse:
        spec = self._authorize(caller, request)
        backend_id = self._backend_for(spec, request.backend_id)
        self._check_bundle(spec)
        try:
            return self._admit(caller, request, spec, backend_id)
        except sa.exc.IntegrityError:  # only (requester, nonce) can collide once the job id is judged
            raise PeerError(
                PeerErrorCode.INVALID_ARGUMENT,
                f"Nonce {request.nonce!r} was already used by {caller!r} for another job; "
                "each handoff of a new job or incarnation needs a fresh nonce",
            ) from None

    def _admit(self, caller: str, request: HandoffRequest, spec: JobSpec, backend_id: str) -> HandoffResponse:
        # What a new incarnation here starts from, whether the job id is new or a finished one's.
        # It is kept in the caller's own namespace: no other peer's job, nor a local one, can be
        # met (or learnt of) under its id.
        new = NewIncarnation(
            spec,
            direction=Direction.RECEIVED,
            submitting_user=request.submitting_user,
            owner_principal=request.owner_principal,
            peer_id=caller,
            backend_id=backend_id,
            nonce=request.nonce,
            key=received_job_key(caller, spec.job_id),
        )
        existing = self.store.get_job(new.job_id)
        if existing is None:
            admission = self.store.admit(new, self.clock())
            if not admission.created:  # a concurrent delivery won the insert: judge against it
                return self._admit(caller, request, spec, backend_id)
            job, replay = admission.job, False
        elif existing.nonce == request.nonce:
            # A replay (the parent did not hear our first answer): same job. Re-report it, so a
            # parent whose cursor already passed its events still converges.
            self.store.record_event(existing.job_id, "replayed", self.clock())
            job, replay = existing, True
        elif not existing.terminal:
            raise PeerError(
                PeerErrorCode.ALREADY_EXISTS,
                f"Job {spec.job_id} is still running here as an earlier incarnation; cancel it first",
            )
        else:
            reincarnated = self.store.reincarnate(new, self.clock())
            if reincarnated is None:  # it came back to life under us: try again from the top
                return self._admit(caller, request, spec, backend_id)
            job, replay = reincarnated, False
        # Start it now, on the backend chosen above (idempotent by nonce): running it does not wait
        # for this cluster's scheduler, and survives the runner's task failing for its own reasons.
        job = self.federation.start_received(job.job_id, job.nonce)
        try:
            self.start_run(job)  # idempotent by (job id, nonce): a replay finds the run already there
        except Exception as error:  # the parent retries (a replay), which creates the run then
            log.warning("Could not create the runner run of %s yet: %s", job.job_id, error)
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"cannot record job {job.job_id} yet: {error}") from error
        log.info("Accepted job %s from %s (%s)", job.job_id, caller, "replay" if replay else "new")
        # A replay may find the job over: its answer carries the result, as a sync would.
        return HandoffResponse(job=job_status(job, result=self._results([job]).get(job.job_id)), replay=replay)

    def _authorize(self, caller: str, request: HandoffRequest) -> JobSpec:
        if request.requester != caller:
            raise PeerError(
                PeerErrorCode.PERMISSION_DENIED,
                f"Federation requester {request.requester!r} does not match the authenticated peer {caller!r}",
            )
        user = request.submitting_user
        if user in ("", LOCAL_ADMIN):
            raise PeerError(
                PeerErrorCode.PERMISSION_DENIED,
                "A federated job needs an accountable submitter; anonymous and local_admin (in-cluster) "
                "identities cannot submit one",
            )
        if not submitter_admitted(self.config.federation.allowed_submitters, user):
            raise PeerError(
                PeerErrorCode.PERMISSION_DENIED, f"Submitter {user!r} is not admitted for federation to this cluster"
            )
        try:
            spec = parse_job({**request.spec, "job_id": request.job_id}, path="spec")
        except SpecError as error:
            raise PeerError(PeerErrorCode.INVALID_ARGUMENT, str(error)) from None
        if not spec.is_root:
            raise PeerError(PeerErrorCode.INVALID_ARGUMENT, "A federation handoff must be a root job.")
        return spec

    def admit_bundle_upload(self, ref: BundleRef) -> None:
        """An upload not begun here is admitted, its room promised (one here or admitted already
        passes); one that would take the bundle store past ``bundles.max_total_bytes``, even once
        everything collectable is gone, is refused before any byte is sent: the parent requeues the
        job for another cluster."""
        problem = self.federation.admit_bundle_upload(ref)
        if problem:
            raise PeerError(PeerErrorCode.RESOURCE_EXHAUSTED, problem)

    def _check_bundle(self, spec: JobSpec) -> None:
        """A job whose workdir is a bundle is admitted once the bundle is here; until then the parent
        is told to upload it (every other check passed: the bytes are not sent in vain)."""
        if spec.bundle is None:
            return
        bundles = self.config.bundle_store()
        if not bundles.has(spec.bundle):
            raise PeerError(
                PeerErrorCode.FAILED_PRECONDITION,
                f"the workdir bundle {spec.bundle.digest} of job {spec.job_id} is not here yet "
                f"({bundles.received(spec.bundle)} of {spec.bundle.size} bytes received); upload it first",
            )

    def _backend_for(self, spec: JobSpec, wanted: str) -> str:
        """The local backend the job runs on: the one placement chose, else the first that fits."""
        routing = spec.routing
        backends = self.federation.local_backends()
        if not any(satisfies_all(b.advertised, routing) for b in backends):
            raise PeerError(
                PeerErrorCode.INVALID_ARGUMENT,
                f"no backend of cluster {self.config.name} can host job {spec.job_id} "
                f"(constraints: {', '.join(str(c) for c in routing) or 'none'})",
            )
        # Its shape matches but no backend is big enough, ever: not here, but maybe on another
        # peer, so the parent requeues it instead of leaving it in this cluster's queue forever.
        fitting = [b.backend_id for b in backends if b.could_host(routing, spec.gate)]
        if not fitting:
            need = ", ".join(f"{amount} {token}" for token, amount in sorted(spec.gate.items()))
            raise PeerError(
                PeerErrorCode.RESOURCE_EXHAUSTED,
                f"no backend of cluster {self.config.name} is large enough for job {spec.job_id} (needs {need})",
            )
        if spec.bundle is not None:
            # A backend that cannot receive the workdir bundle (no bundle store, or a smaller one than
            # it needs) cannot run the job: another cluster may, so the parent requeues it.
            size = spec.bundle.size
            receiving = [b for b in fitting if bundle_limit(self.backends.get(b)) >= size]
            if not receiving:
                limits = ", ".join(f"{b} at most {bundle_limit(self.backends.get(b))} bytes" for b in fitting)
                raise PeerError(
                    PeerErrorCode.RESOURCE_EXHAUSTED,
                    f"no backend of cluster {self.config.name} can receive job {spec.job_id}'s workdir bundle of "
                    f"{size} bytes (bundles taken: {limits})",
                )
            fitting = receiving
        return wanted if wanted in fitting else fitting[0]

    # What the parent may ask about jobs it handed off ------------------------------------------

    def _handed_by(self, caller: str, job_id: str) -> JobRecord:
        job = self.store.get_job(received_job_key(caller, job_id))
        if job is None or job.direction is not Direction.RECEIVED or job.peer_id != caller:
            raise PeerError(PeerErrorCode.NOT_FOUND, f"Job {job_id} not found")
        return job

    def _in_tree_handed_by(self, caller: str, job_id: str) -> JobRecord:
        """A job the caller handed off, or a job of such a job's tree (which runs here)."""
        if parent_key(job_id) is None:
            return self._handed_by(caller, job_id)
        self._handed_by(caller, root_key(job_id))  # its root must be one the caller handed over
        child = self.store.get_job(received_job_key(caller, job_id))
        if child is None:
            raise PeerError(PeerErrorCode.NOT_FOUND, f"Job {job_id} not found")
        return child

    def sync(self, caller: str, cursor: str) -> SyncResponse:
        latest = self.store.latest_event_seq()
        position = int(cursor) if cursor.isdigit() else None
        if position is None or position > latest:  # a new parent, or this store was reset: everything
            jobs = self.store.received_jobs(caller)
            results = self._results(jobs)
            if sum(len(result) for result in results.values()) <= SYNC_RESULTS_BUDGET:
                deltas = [self._status(j, results.get(j.job_id)) for j in jobs]
                return SyncResponse(deltas=deltas, next_cursor=str(latest), cursor_stale=True)
            position = 0  # too many results for one answer: every change from the start, over several
        changes = self.store.received_changes(caller, after_seq=max(0, position - SYNC_OVERLAP), limit=SYNC_LIMIT)
        if len(changes) == SYNC_LIMIT:  # more than one answer holds: the parent asks again from here
            latest = changes[-1][1]
        changes = _as_roots(changes)  # a child's change is its root's: the tree travels with the root
        records = self.store.get_jobs([job_id for job_id, _ in changes])
        results = self._results([job for job in records.values() if job.peer_id == caller])
        deltas = []
        carried, new = 0, 0  # bytes of results in this answer; changes past the cursor in it
        for job_id, seq in changes:
            job = records.get(job_id)
            if job is None or job.direction is not Direction.RECEIVED or job.peer_id != caller:
                deltas.append(JobStatus(job_id=wire_job_id(caller, job_id), nonce="", state="killed", tombstone=True))
                continue
            result = results.get(job_id)
            if result is not None and carried + len(result) > SYNC_RESULTS_BUDGET:
                # Results bound the answer (each may be 1 MiB). A re-read of the overlap was carried by
                # an earlier answer: it is left out. A new change is the next answer's first, once this
                # one has made progress past the cursor.
                if seq <= position:
                    continue
                if new:
                    latest = seq - 1
                    break
            carried += len(result or "")
            new += seq > position
            deltas.append(self._status(job, result))
        return SyncResponse(deltas=deltas, next_cursor=str(latest))

    def _status(self, job: JobRecord, result: str | None) -> JobStatus:
        """A received job as a sync reports it: its replicas, result, tree and serving URLs."""
        return job_status(job, self.backends, result, self.store.tree(job.job_id), self._serving_urls(job))

    def _serving_urls(self, job: JobRecord) -> dict[str, str] | None:
        """Where this cluster serves the job's named ports while it runs here ({} while it does not
        run); None for a job without ports, or where this cluster mints no URLs."""
        if not job.spec.get("ports") or self.mint_serving_urls is None:
            return None
        if job.state is not JobState.RUNNING:
            return {}
        try:
            return dict(self.mint_serving_urls(job))
        except (OSError, ValueError) as error:  # an unreadable secret: the runner task's log says so too
            log.warning("Cannot mint the serving URLs of job %s: %s", job.job_id, error)
            return None

    def _results(self, jobs: Iterable[JobRecord]) -> dict[str, str]:
        """What the succeeded ones among ``jobs`` handed back, by job key."""
        return self.store.job_results({job.job_id: job.nonce for job in jobs if job.state is JobState.SUCCEEDED})

    def terminate(self, caller: str, job_id: str, nonce: str = "") -> JobStatus:
        job = self._handed_by(caller, job_id)
        if nonce and job.nonce != nonce:
            raise PeerError(PeerErrorCode.NOT_FOUND, f"Job {job_id} is not here as incarnation {nonce}")
        if job.terminal:
            # Already over: re-report it anyway, so a parent whose mirror is stuck converges.
            self.store.record_event(job.job_id, "rereported", self.clock())
        elif not job.cancel_requested:  # asked again while it stops: this cluster's re-drive already has it
            self.federation.cancel(job.job_id)  # recorded, and the backend running it told now, not next tick
        current = self.store.get_job(job.job_id) or job
        return job_status(current, result=self._results([current]).get(current.job_id))

    def logs(self, caller: str, job_id: str, cursor: str, max_lines: int) -> LogsResponse:
        """Output of a job the caller handed off, or of a child in its tree."""
        job = self._in_tree_handed_by(caller, job_id)
        backend = self.backends.get(job.backend_id)
        if backend is None:
            return LogsResponse(lines=[], next_cursor=cursor)
        chunk = backend.logs(job.job_id, cursor, max(1, min(max_lines, 5000)))
        return LogsResponse(lines=list(chunk.lines), next_cursor=chunk.next_cursor, truncated=chunk.truncated)

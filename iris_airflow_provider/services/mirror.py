"""Keeping the store in step with whoever runs each job: status sync and output relay.

Local backends and peers report states; the store mirrors them (by compare-and-set on the
incarnation's nonce, so another incarnation's news is ignored). New output of jobs in flight is
copied into the store for their waiting tasks; a job's last output is relayed before its end is
mirrored, so a task that sees the end has all of it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, replace

from iris_airflow_provider.backends.base import JobReport, LogChunk
from iris_airflow_provider.core.grace import unreported_job_is_gone
from iris_airflow_provider.core.job_report import ChildReport
from iris_airflow_provider.core.job_tree import parent_key
from iris_airflow_provider.core.serving import ServingOrigins, accepted_serving_urls
from iris_airflow_provider.core.states import Direction, HandoffState
from iris_airflow_provider.peers.base import Peer, PeerError, SyncResult
from iris_airflow_provider.services.fanout import each_peer
from iris_airflow_provider.services.ports import MirrorStore
from iris_airflow_provider.services.runners import RUN_HERE, Runners
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)

LOGGED_HANDOFFS = (HandoffState.PENDING, HandoffState.HANDED_OFF)  # handoffs a peer may have output for
LOG_LINES_PER_TICK = 500  # per job: a chatty job cannot hold up a tick

LogReader = Callable[[JobRecord], LogChunk]


@dataclass(eq=False)  # a service, compared by identity
class Mirror:
    store: MirrorStore
    _: KW_ONLY
    runners: Runners
    clock: Callable[[], int]
    timeout_s: float
    relay_origin: str = ""  # this cluster's public origin, where its serving relay is reached

    def sync(self, reported: list[str]) -> list[JobRecord]:
        """Take in what peers and local backends report (appending the ids of jobs whose state changed
        to ``reported``); returns the jobs that were in flight."""
        in_flight = self.store.in_flight()
        sent: dict[str, list[JobRecord]] = defaultdict(list)
        local: list[JobRecord] = []
        for job in in_flight:
            if job.direction in RUN_HERE:
                local.append(job)
            elif self.runners.peer_of(job) is not None:
                sent[job.peer_id].append(job)

        def sync_peer(peer: Peer) -> SyncResult:
            ids = [job.job_id for job in sent[peer.peer_id]]
            return peer.sync(ids, self.store.sync_cursor(peer.peer_id))

        results = each_peer(self._peers(sent), sync_peer, self.timeout_s)
        reports: list[tuple[JobRecord, JobReport]] = []
        cursors: dict[str, str] = {}
        for peer_id, result in results.items():
            if isinstance(result, BaseException):
                log.warning("Status sync with peer %s failed: %s", peer_id, result)
                continue
            for job in sent[peer_id]:
                job_report = result.reports.get(job.job_id)
                if job_report is not None:
                    reports.append((job, job_report))
                elif self._gone(job, job.job_id in result.gone):
                    reported.append(job.job_id)
            cursors[peer_id] = result.cursor
        changed = self.apply_reports(reports)  # every peer's reports in one transaction
        for job, job_report in reports:  # a root's tree as it runs on the peer
            tree = job_report.children
            if tree is not None and job_report.nonce == job.nonce and self._mirror_children(job, tree):
                changed.add(job.job_id)
        self.store.save_sync_cursors(cursors, self.clock())  # after the reports they cover
        reported += [job.job_id for job, _ in reports if job.job_id in changed]
        for job in local:
            if self._sync_local(job):
                reported.append(job.job_id)
        return in_flight

    def _mirror_children(self, job: JobRecord, tree: Sequence[ChildReport]) -> bool:
        return self.store.mirror_children(job.job_id, job.nonce, tree, self.clock())

    def _sync_local(self, job: JobRecord) -> bool:
        backend = self.runners.backend_of(job)
        if backend is None:
            return False
        job_report = backend.status(job.job_id)
        if job_report is not None:
            changed = self.apply_report(job, job_report)
            if changed and parent_key(job.job_id) is not None and job_report.state != job.state:
                self.store.note_child(job.job_id, job_report.state, job_report.exit_code, self.clock())
            return changed
        now = self.clock()
        gone = unreported_job_is_gone(
            job.direction, ever_reported=job.reported_at_ms is not None, submitted_at_ms=job.submitted_at_ms, now_ms=now
        )
        return gone and self.store.mark_gone(job.job_id, job.nonce, now)

    def _gone(self, job: JobRecord, gone: bool) -> bool:
        # Only a handed-off job can be gone: a pending one may simply not have arrived yet.
        if gone and job.handoff_state is HandoffState.HANDED_OFF:
            return self.store.mark_gone(job.job_id, job.nonce, self.clock())
        return False

    def apply_report(self, job: JobRecord, job_report: JobReport) -> bool:
        """Mirror what runs ``job`` reports about it; whether the store changed."""
        return job.job_id in self.apply_reports([(job, job_report)])

    def apply_reports(self, reports: Sequence[tuple[JobRecord, JobReport]]) -> set[str]:
        """:meth:`apply_report` for each ``(job, its report)`` (distinct jobs), the store's writes in
        one transaction; the ids of the jobs that changed."""
        current = []
        for job, job_report in reports:
            if job_report.nonce != job.nonce:
                continue  # another incarnation's news
            if job_report.state.terminal and not job.terminal:
                # Its last output first: a task waiting on the job then has all of it when it sees the end.
                reader = self.log_reader(job)
                if reader is not None:
                    self.relay(job, reader)
                # And its children's: those mirrored before, and those this very report is the first
                # to name (a tree that ran wholly between two syncs), whose output is otherwise lost.
                cursors = _child_cursors(job)
                cursors.update({c.job_id: "" for c in job_report.children or () if c.job_id not in cursors})
                peer = self.runners.peer_of(job) if cursors else None
                if peer is not None:
                    self.relay_children(job, peer, cursors)
            current.append(self._checked_serving_urls(job, job_report))
        return self.store.mirror_many(current, self.clock()) if current else set()

    def _checked_serving_urls(self, job: JobRecord, job_report: JobReport) -> JobReport:
        """``job_report`` with only the serving URLs this cluster may show for ``job``: those of a job it
        handed to a peer, pointing at its own relay for that peer or at the peer itself (a lying
        peer plants no link in the task log, XCom or UI); the others dropped with a warning."""
        reported = job_report.serving_urls
        peer = self.runners.peer_of(job) if job.direction is Direction.SENT else None
        if reported is None or peer is None:
            return replace(job_report, serving_urls=None) if reported is not None else job_report
        origins = ServingOrigins(peer.peer_id, self.relay_origin, peer.address)
        declared = [str(port.get("name")) for port in job.spec.get("ports") or () if isinstance(port, dict)]
        accepted, dropped = accepted_serving_urls(reported, declared_ports=declared, origins=origins)
        for problem in dropped:
            log.warning(
                "Peer %s reported a serving URL for job %s that is not kept: %s", peer.peer_id, job.job_id, problem
            )
        return replace(job_report, serving_urls=accepted)

    # Output ------------------------------------------------------------------------------------

    def log_reader(self, job: JobRecord) -> LogReader | None:
        """How to read the job's new output from whoever runs it (None when nobody does yet)."""
        backend = self.runners.backend_of(job)
        if backend is not None:
            return lambda j: backend.logs(j.job_id, j.log_cursor, LOG_LINES_PER_TICK)
        peer = self.runners.peer_of(job)
        if peer is not None and job.handoff_state in LOGGED_HANDOFFS:
            return _peer_reader(peer)
        return None

    def relay_logs(self, jobs: list[JobRecord]) -> None:
        """Copy new output of jobs in flight into the store, for their waiting tasks; peers in parallel."""
        by_peer: dict[str, list[JobRecord]] = defaultdict(list)
        for job in self.store.get_jobs(j.job_id for j in jobs).values():  # fresh cursors
            reader = self.log_reader(job)
            if reader is None or job.terminal:
                continue  # a job that just finished had its last output relayed before its end
            if job.direction is Direction.SENT:
                by_peer[job.peer_id].append(job)
            else:
                self.relay(job, reader)

        def relay_peer(peer: Peer) -> None:
            for job in by_peer[peer.peer_id]:
                self.relay(job, _peer_reader(peer))
                self.relay_children(job, peer, _child_cursors(job))

        for peer_id, result in each_peer(self._peers(by_peer), relay_peer, self.timeout_s).items():
            if isinstance(result, BaseException):
                log.info("Could not relay output from peer %s this tick: %s", peer_id, result)

    def _peers(self, peer_ids: Iterable[str]) -> dict[str, Peer]:
        return {peer_id: self.runners.peers[peer_id] for peer_id in peer_ids}

    def relay(self, job: JobRecord, read: LogReader) -> None:
        try:
            chunk = read(job)
        except (PeerError, OSError, ValueError) as error:  # ValueError: a local backend's unreadable cursor
            log.info("Could not relay output of %s this tick: %s", job.job_id, error)
            return
        if chunk.lines or chunk.next_cursor != job.log_cursor:
            self.store.append_logs(job.job_id, job.nonce, chunk.lines, chunk.next_cursor, self.clock())

    def relay_children(self, job: JobRecord, peer: Peer, cursors: Mapping[str, str]) -> None:
        """Copy new output of a handed-off root's children (by id, with where reading each has got to)
        into its output, each line naming its child."""
        for child_id, cursor in cursors.items():
            try:
                chunk = peer.logs(child_id, cursor, LOG_LINES_PER_TICK)
            except (PeerError, OSError, ValueError) as error:
                log.info("Could not relay output of %s this tick: %s", child_id, error)
                continue
            if chunk.lines or chunk.next_cursor != cursor:
                self.store.append_child_logs(
                    job.job_id, job.nonce, child_id, chunk.lines, chunk.next_cursor, self.clock()
                )


def _child_cursors(job: JobRecord) -> dict[str, str]:
    """Where relaying the output of each of a root's mirrored children has got to."""
    return {child["job_id"]: child.get("log_cursor", "") for child in job.children}


def _peer_reader(peer: Peer) -> LogReader:
    return lambda j: peer.logs(j.job_id, j.log_cursor, LOG_LINES_PER_TICK)

"""Retention: finished jobs leave the store once they are old enough, with their history, output and result.

Every delete is conditional on what the caller judged: the incarnation (nonce) still finished
before the cutoff, so a job run again in the meantime is never touched. Work is bounded per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from iris_airflow_provider.store.common import TERMINAL_VALUES, StoreBase, not_terminal
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.schema import job_events, job_logs, job_results, jobs, superseded_incarnations


class Retention(StoreBase):
    def finished_before(self, cutoff_ms: int, limit: int) -> list[JobRecord]:
        """Up to ``limit`` jobs that ended before ``cutoff_ms``, oldest end first."""
        query = (
            sa.select(jobs)
            .where(jobs.c.state.in_(TERMINAL_VALUES), jobs.c.finished_at_ms < cutoff_ms)
            .order_by(jobs.c.finished_at_ms, jobs.c.job_id)
            .limit(limit)
        )
        with self._read() as connection:
            return [JobRecord.from_row(row) for row in connection.execute(query).mappings()]

    def prune_jobs(self, incarnations: Sequence[tuple[str, str]], cutoff_ms: int) -> list[str]:
        """Delete these (job id, nonce) incarnations, with their events and output, if each is still
        that incarnation and still finished before ``cutoff_ms``; the ids deleted."""
        if not incarnations:
            return []
        with self._write() as connection:
            deleted = [
                row[0]
                for row in connection.execute(
                    jobs.delete()
                    .where(
                        sa.tuple_(jobs.c.job_id, jobs.c.nonce).in_(list(incarnations)),
                        jobs.c.state.in_(TERMINAL_VALUES),
                        jobs.c.finished_at_ms < cutoff_ms,
                    )
                    .returning(jobs.c.job_id)
                )
            ]
            if deleted:
                for table in (job_events, job_logs, job_results, superseded_incarnations):
                    connection.execute(table.delete().where(table.c.job_id.in_(deleted)))
        return deleted

    def prune_superseded_output(self, cutoff_ms: int, limit: int) -> int:
        """Delete the output of up to ``limit`` incarnations that were replaced (a rerun, a requeue)
        before ``cutoff_ms``: nobody reads it (a job's page and its task show its current one)."""
        with self._write() as connection:
            replaced = connection.execute(
                sa.select(superseded_incarnations.c.job_id, superseded_incarnations.c.nonce)
                .where(superseded_incarnations.c.superseded_at_ms < cutoff_ms)
                .order_by(superseded_incarnations.c.superseded_at_ms)
                .limit(limit)
            ).all()
            if not replaced:
                return 0
            pairs = [(job_id, nonce) for job_id, nonce in replaced]
            lines: int = connection.execute(
                job_logs.delete().where(sa.tuple_(job_logs.c.job_id, job_logs.c.nonce).in_(pairs))
            ).rowcount
            connection.execute(
                superseded_incarnations.delete().where(
                    sa.tuple_(superseded_incarnations.c.job_id, superseded_incarnations.c.nonce).in_(pairs)
                )
            )
        return lines

    def live_bundle_digests(self) -> set[str]:
        """The workdir bundles jobs not yet finished refer to (local, sent and received): the
        bundle store keeps these whatever their age."""
        digest = jobs.c.spec["bundle"]["digest"].as_string()
        query = sa.select(digest).distinct().where(not_terminal(), digest.is_not(None))
        with self._read() as connection:
            return {value for (value,) in connection.execute(query) if value}

"""Replica status: what the runner reports per replica is kept, changes alone are news, and a report
without replicas (a peer that sends none) does not erase what was known."""

from __future__ import annotations

from iris_airflow_provider.core.job_report import JobReport, ReplicaReport
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store.store import FederationStore
from tests.store.test_store import NOW, promotion, queue


def test_replicas_are_kept_as_last_reported(store: FederationStore) -> None:
    job = queue(store)
    assert store.promote(promotion(), NOW)
    running = (ReplicaReport(0, JobState.RUNNING), ReplicaReport(1, JobState.RUNNING))
    assert store.mirror(JobReport(job.job_id, job.nonce, JobState.RUNNING, "default", replicas=running), NOW + 1)
    assert store.get_job(job.job_id).replicas == running

    # Same job state, one replica failed: that alone is a change worth writing.
    one_failed = (ReplicaReport(0, JobState.RUNNING), ReplicaReport(1, JobState.FAILED, 7))
    assert store.mirror(JobReport(job.job_id, job.nonce, JobState.RUNNING, "default", replicas=one_failed), NOW + 2)
    assert store.get_job(job.job_id).replicas == one_failed
    assert not store.mirror(JobReport(job.job_id, job.nonce, JobState.RUNNING, "default", replicas=one_failed), NOW + 3)

    # A report without replicas keeps them; the end names the replica that failed.
    assert store.mirror(JobReport(job.job_id, job.nonce, JobState.FAILED, "default", exit_code=7), NOW + 4)
    ended = store.get_job(job.job_id)
    assert ended.replicas == one_failed and ended.failed_replicas == "replica 1 (exit code 7)"
    assert ended.report().replicas == one_failed


def test_another_incarnations_replicas_are_ignored(store: FederationStore) -> None:
    job = queue(store)
    assert store.promote(promotion(), NOW)
    stale = JobReport(
        job.job_id, "an-old-nonce", JobState.RUNNING, "default", replicas=(ReplicaReport(0, JobState.FAILED, 1),)
    )
    assert not store.mirror(stale, NOW + 1)
    assert store.get_job(job.job_id).replicas == ()

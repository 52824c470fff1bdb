"""Replica status reaches the job's page, ``describe`` and the failure message."""

from __future__ import annotations

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.job_views import job_details
from tests.services.world import ALICE, World, tick_until


def test_a_failed_replica_is_named_on_the_jobs_page(lite: World) -> None:
    federation = lite.federation()
    job = parse_job(
        {
            "job_id": "/alice/pair",
            "command": 'if [ "$IRIS_REPLICA_INDEX" = 1 ]; then exit 3; fi; sleep 1',
            "resources": {"replicas": 2},
        }
    )
    federation.submit(job, submitting_user=ALICE)
    failed = tick_until(federation, lite.store, "/alice/pair", JobState.FAILED)
    assert "replica 1 (exit code 3)" in failed.failed_replicas  # its sibling, stopped with it, is listed too
    replicas = job_details(federation, failed, lite.clock())["replicas"]
    assert [(r["index"], r["state"], r["exit_code"]) for r in replicas][1] == (1, "failed", 3)

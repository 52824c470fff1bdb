"""The one job-state value and the projection every other shape converts through."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from iris_airflow_provider.core.job_report import JobReport, ReplicaReport, projected
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.wire import JobStatus

REPORT = JobReport(
    job_id="/alice/train",
    nonce="n1",
    state=JobState.FAILED,
    backend_id="default",
    error="Replica 1 exited with code 7",
    exit_code=7,
    started_at_ms=10,
    finished_at_ms=20,
    replicas=(ReplicaReport(0, JobState.SUCCEEDED, 0), ReplicaReport(1, JobState.FAILED, 7)),
)


@dataclass
class Row:
    """A shape with more fields than the report, and one field the report has not."""

    job_id: str = "/bob/eval"
    nonce: str = "n2"
    state: JobState = JobState.RUNNING
    backend_id: str = "cpu"
    error: str = ""
    exit_code: int | None = None
    started_at_ms: int | None = 5
    finished_at_ms: int | None = None
    row_version: int = 3


def test_projection_takes_the_fields_the_target_names_and_leaves_the_rest() -> None:
    report = projected(Row(), JobReport)
    assert report == JobReport("/bob/eval", "n2", JobState.RUNNING, "cpu", started_at_ms=5)


def test_overrides_win_and_missing_fields_keep_their_defaults() -> None:
    report = projected({"job_id": "/x", "nonce": "n", "state": JobState.PENDING}, JobReport, backend_id="b")
    assert (report.backend_id, report.error, report.replicas) == ("b", "", ())


def test_a_source_missing_a_required_field_is_an_error_not_a_silent_default() -> None:
    with pytest.raises(TypeError, match="backend_id"):
        projected({"job_id": "/x", "nonce": "n", "state": JobState.PENDING}, JobReport)


def test_the_wire_round_trips_the_report_with_its_replicas() -> None:
    status = JobStatus.of(REPORT)
    assert status.replicas[1].exit_code == 7 and not status.tombstone
    assert JobStatus.model_validate_json(status.model_dump_json()).to_report() == REPORT

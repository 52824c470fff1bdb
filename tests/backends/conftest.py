"""Fixtures of the process backend's tests: a state directory cleaned of leftover processes, release files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from iris_airflow_provider.backends.process import processes
from tests.backends.process_helpers import Gates


@pytest.fixture
def gates(tmp_path: Path) -> Gates:
    return Gates(tmp_path / "gates")


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "backend"
    yield directory
    # Stop whatever a failed test left running: each live job's session, by the supervisor's pid.
    jobs = directory / "jobs"
    if jobs.exists():
        for path in jobs.glob("*/status.json"):
            status = json.loads(path.read_text())
            if status["state"] in ("starting", "running") and status.get("pid"):
                processes.kill_session(status["pid"])

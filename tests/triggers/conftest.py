"""Fixtures for the triggers: a real SQLite store file per test, named by the store connection.

The store is written with the synchronous ``FederationStore`` from the test (as the placement
tick and the peers' reports would from other processes) while the triggers read it through
aiosqlite on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.store.records import JobRecord, NewIncarnation
from iris_airflow_provider.store.store import FederationStore
from iris_airflow_provider.triggers.poller import SharedJobPoller

INTERVAL = 0.05  # the triggers' poll interval in these tests (seconds)
PEER = "cw-h100"


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'federation.db'}"


@pytest.fixture
def store(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FederationStore]:
    """The migrated store, and the ``iris_federation_default`` connection naming it (runtime doc, section 7)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", json.dumps({"conn_type": "irisfederation", "host": store_url})
    )
    federation_store = FederationStore.from_url(store_url)
    federation_store.migrate()
    yield federation_store
    federation_store.dispose()


@pytest.fixture(autouse=True)
async def no_poller_left_behind() -> AsyncIterator[None]:
    """Every test must release its pollers (the triggerer keeps one process for days)."""
    yield
    left = dict(SharedJobPoller._pollers)
    for poller in left.values():
        await poller.close()
    assert not left, f"pollers still registered after the test: {list(left)}"


def now_ms() -> int:
    return int(time.time() * 1000)


def queue_job(store: FederationStore, job_id: str, *, pin: str = "", at_ms: int | None = None) -> JobRecord:
    spec = parse_job({"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}}})
    when = now_ms() if at_ms is None else at_ms
    return store.admit(
        NewIncarnation(spec, direction=Direction.SENT, submitting_user="alice@example.com", peer_id=pin), now_ms=when
    ).job


def promote(store: FederationStore, job_id: str, peer: str = PEER) -> None:
    assert store.promote(Promotion(job_id, peer, "default", False, {"h100": 8}, None), now_ms())


def hand_off(store: FederationStore, job_id: str) -> None:
    job = store.get_job(job_id)
    assert job is not None
    assert store.mark_handed_off(job_id, job.nonce, now_ms())


def report(store: FederationStore, job_id: str, state: JobState, **extra: Any) -> None:
    job = store.get_job(job_id)
    assert job is not None
    assert store.mirror(JobReport(job_id, job.nonce, state, "default", **extra), now_ms())


async def stays_false(check: Callable[[], Any], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not check()
        await asyncio.sleep(0.01)


def route_log_to_stdlib(trigger: Any) -> None:
    """Airflow hands triggers a structlog logger that caplog cannot see; in the triggerer those lines
    land in the task log. Give the trigger a stdlib logger of the same name instead."""
    name = f"{type(trigger).__module__}.{type(trigger).__qualname__}"
    trigger._log = logging.getLogger(name)

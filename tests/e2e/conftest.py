"""The e2e tests' fixtures: a real Airflow deployment (api-server, scheduler, dag-processor, triggerer)
on PostgreSQL, the parent and peer pair several modules share, a browser."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.store.store import FederationStore
from tests.postgres import scratch_database

CLUSTER = """
name: marin
placement:
  tick_interval_seconds: 30
  sync_interval_seconds: 2
federation:
  service_principals: {"ml-platform@example.com": ["e2e_service_*"]}
backends:
  - {id: cpu, kind: process, max_running_jobs: 4}
peers:
  - id: cw-h100
    kind: agentless
    backends: [{id: default, kind: process, devices: {h100: 8}}]
    allowed_submitters: [alice, bob]
  - id: cw-gb200
    kind: agentless
    backends: [{id: default, kind: process, devices: {gb200: 4}}]
    allowed_submitters: [alice, bob]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    home = tmp_path_factory.mktemp("airflow-parent")
    (home / "cluster.yaml").write_text(CLUSTER)
    with scratch_database("iris_e2e_meta") as metadata_url, scratch_database("iris_e2e_store") as store_url:
        deployment = AirflowDeployment(
            home=home,
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            cluster_config=home / "cluster.yaml",
            dags_folder=Path(__file__).parent / "dags",
        )
        try:
            deployment.start()
            deployment.wait_for_dag("iris_federation_tick")
            yield deployment
        finally:
            deployment.stop()
            save_logs(deployment, "parent")


def save_logs(deployment: AirflowDeployment, name: str) -> None:
    """Keep the components' logs as test artifacts (.artifacts/e2e-logs/<name>/)."""
    artifacts = Path(__file__).resolve().parents[2] / ".artifacts" / "e2e-logs" / name
    artifacts.mkdir(parents=True, exist_ok=True)
    for log in sorted((deployment.home / "logs").glob("*.log")):  # every component's instances, the Celery worker's
        (artifacts / log.name).write_bytes(log.read_bytes())


def migrated_store(url: str) -> FederationStore:
    """The store at ``url`` at the schema the deployment's processes use: a test may read it before
    any of them has opened (and so migrated) it, which would find no tables."""
    store = FederationStore.from_url(url)
    store.migrate()
    return store


@pytest.fixture(scope="module")
def store(deployment: AirflowDeployment) -> Iterator[FederationStore]:
    store = migrated_store(deployment.store_url)
    yield store
    store.dispose()


ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "ui"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (one per module); screenshots go to ``ARTIFACTS``."""
    from devtools.browser import chromium, chromium_path

    if chromium_path() is None:
        message = "Chromium is not installed; run scripts/install-browser.sh (Debian's chromium package)"
        if os.environ.get("IRIS_REQUIRE_BROWSER") == "1":
            pytest.fail(message + " (IRIS_REQUIRE_BROWSER=1)")
        pytest.skip(message)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium() as launched:
        yield launched


# The pair of tests/e2e/shared_federation.py: one for every module that asks for `federation`.


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Parent ``marin`` and peer ``cw-east``, shared with the other modules that use this fixture."""
    from tests.e2e.shared_federation import SHARED

    return SHARED.get(tmp_path_factory)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests.e2e.shared_federation import group_shared_modules

    group_shared_modules(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the shared pair once the tests in a row that use it are done (their module fixtures too)."""
    from tests.e2e.shared_federation import SHARED, uses_shared_pair

    try:
        return (yield)
    finally:
        if uses_shared_pair(item) and (nextitem is None or not uses_shared_pair(nextitem)):
            SHARED.close()


def pytest_sessionfinish() -> None:
    from tests.e2e.shared_federation import SHARED

    SHARED.close()  # after an interrupted run, too

from __future__ import annotations

from collections.abc import Iterator

import pytest

from iris_airflow_provider.store.schema import metadata
from iris_airflow_provider.store.store import FederationStore
from tests.postgres import scratch_database


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with scratch_database() as url:
        store = FederationStore.from_url(url)
        store.migrate()
        store.dispose()
        yield url


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[FederationStore]:
    """The session's migrated PostgreSQL database, emptied for this test."""
    store = FederationStore.from_url(postgres_url)
    with store.engine.begin() as connection:
        tables = ", ".join(table.name for table in metadata.sorted_tables)
        connection.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    yield store
    store.dispose()


@pytest.fixture
def sqlite_store(tmp_path) -> Iterator[FederationStore]:
    store = FederationStore.from_url(f"sqlite:///{tmp_path / 'federation.db'}")
    store.migrate()
    yield store
    store.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> FederationStore:
    """The same tests on the embedded store and on PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_store")

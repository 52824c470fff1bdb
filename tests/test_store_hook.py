"""The federation store hook: which database an Airflow connection names."""

from __future__ import annotations

import json

import pytest
from airflow.models.connection import Connection

from iris_airflow_provider.hooks import federation_store
from iris_airflow_provider.hooks.federation_store import FederationStoreHook, store_url_from_connection
from iris_airflow_provider.store.migrate import head_revision
from iris_airflow_provider.store.store import FederationStore
from tests.postgres import scratch_database


@pytest.mark.parametrize(
    ("connection", "url"),
    [
        (Connection(conn_type="irisfederation", host="sqlite:////var/iris.db"), "sqlite:////var/iris.db"),
        (
            Connection(conn_type="postgres", host="db", login="u", password="p", port=5432, schema="iris"),
            "postgresql://u:p@db:5432/iris",
        ),
        (Connection(uri="postgresql+psycopg://u@db:5432/iris"), "postgresql+psycopg://u@db:5432/iris"),
        (Connection(uri="sqlite:////var/lib/iris.db"), "sqlite:////var/lib/iris.db"),
        (Connection(conn_type="irisfederation", extra=json.dumps({"url": "sqlite:///x.db"})), "sqlite:///x.db"),
    ],
)
def test_the_store_url_comes_from_the_connection(connection, url):
    assert store_url_from_connection(connection) == url


def test_without_a_connection_the_store_is_sqlite_in_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", raising=False)
    assert FederationStoreHook().get_url() == f"sqlite:///{tmp_path}/iris_federation.db"


def test_airflow_home_is_read_as_airflow_reads_it(monkeypatch, tmp_path):
    """``~`` and ``$VARS`` in AIRFLOW_HOME are expanded, as Airflow does (no directory named ``~``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("IRIS_TEST_SITE", "site-a")
    monkeypatch.setenv("AIRFLOW_HOME", "~/$IRIS_TEST_SITE/airflow")
    monkeypatch.delenv("AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", raising=False)
    assert FederationStoreHook().get_url() == f"sqlite:///{tmp_path}/site-a/airflow/iris_federation.db"
    from iris_airflow_provider.cluster.config import load_cluster_config

    assert load_cluster_config(None).resolved_state_dir() == tmp_path / "site-a" / "airflow" / "iris"


def test_a_named_connection_that_does_not_exist_is_an_error(monkeypatch):
    from airflow.sdk.exceptions import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException):
        FederationStoreHook("no_such_connection").get_url()


async def test_the_async_url_uses_a_non_blocking_driver(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", "postgresql://u@db:5432/iris")
    assert await FederationStoreHook().aget_url() == "postgresql+asyncpg://u@db:5432/iris"
    monkeypatch.setenv("AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", f"sqlite:///{tmp_path}/s.db")
    # Looked up once per connection for a while: thousands of triggers start at once.
    assert await FederationStoreHook().aget_url() == "postgresql+asyncpg://u@db:5432/iris"
    federation_store._async_urls.clear()
    assert await FederationStoreHook().aget_url() == f"sqlite+aiosqlite:///{tmp_path}/s.db"


def test_the_hook_opens_a_migrated_store_once_per_process(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT", f"sqlite:///{tmp_path}/store.db")
    store = FederationStoreHook().get_store()
    assert store is FederationStoreHook().get_store()
    assert store.queued_jobs() == []


# The connection form's Test button ------------------------------------------------------------------------------


def test_a_password_from_the_password_field_joins_a_url_without_one():
    connection = Connection(conn_type="irisfederation", host="postgresql://iris@db:5432/iris", password="s3cret")
    assert store_url_from_connection(connection) == "postgresql://iris:s3cret@db:5432/iris"
    in_url = Connection(conn_type="irisfederation", host="postgresql://iris:own@db/iris", password="other")
    assert store_url_from_connection(in_url) == "postgresql://iris:own@db/iris"  # the URL's own wins


def _test(monkeypatch, url: str, password: str | None = None) -> tuple[bool, str]:
    """What the REST API's connection test does: the connection in an environment variable, then the hook."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_IRIS_TEST_STORE", json.dumps({"conn_type": "irisfederation", "host": url, "password": password})
    )
    return Connection.get_connection_from_secrets("iris_test_store").test_connection()


def test_a_migrated_store_passes(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    FederationStore.from_url(url).migrate()
    ok, message = _test(monkeypatch, url)
    assert ok, message
    assert message == f"Federation store at {url}: reachable, schema at the current migration ({head_revision()})."


def test_an_empty_database_passes_saying_its_schema_is_created_on_first_use(monkeypatch, tmp_path):
    (tmp_path / "empty.db").write_bytes(b"")
    ok, message = _test(monkeypatch, f"sqlite:///{tmp_path}/empty.db")
    assert ok and message.endswith(f"reachable and empty; its schema ({head_revision()}) is created on first use.")
    assert FederationStore.from_url(f"sqlite:///{tmp_path}/empty.db").revision() is None  # the test created nothing


def test_an_older_schema_passes_saying_it_is_upgraded_on_first_use(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    FederationStore.from_url(url).migrate("0007")
    ok, message = _test(monkeypatch, url)
    assert ok and message.endswith(f"schema at migration 0007; upgraded to {head_revision()} on first use."), message


def test_a_schema_of_a_newer_provider_fails(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path}/newer.db"
    store = FederationStore.from_url(url)
    store.migrate()
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE iris_alembic_version SET version_num = '0099_from_the_future'")
    ok, message = _test(monkeypatch, url)
    assert not ok
    assert "its schema is at migration '0099_from_the_future', which iris-airflow-provider" in message
    assert message.endswith("does not know (a newer provider version wrote it); upgrade the provider here.")


def test_a_missing_sqlite_file_fails_and_is_not_created(monkeypatch, tmp_path):
    ok, message = _test(monkeypatch, f"sqlite:///{tmp_path}/nowhere/store.db")
    assert not ok
    assert message.startswith(f"SQLite database file '{tmp_path}/nowhere/store.db' does not exist on this machine")
    assert not (tmp_path / "nowhere").exists()


def test_an_unreachable_postgresql_fails_naming_it_without_its_password(monkeypatch):
    ok, message = _test(monkeypatch, "postgresql://iris@127.0.0.1:1/iris_federation", password="s3cret")
    assert not ok
    assert message.startswith("Cannot open the federation store at postgresql://iris:***@127.0.0.1:1/iris_federation: ")
    assert "refused" in message and "s3cret" not in message


def test_an_unsupported_database_fails_naming_the_accepted_ones(monkeypatch):
    ok, message = _test(monkeypatch, "mysql://iris@db/iris")
    assert (ok, message) == (
        False,
        "SQLAlchemy URL: mysql://iris@db/iris is a mysql database; the store runs on postgresql or sqlite",
    )


def test_a_migrated_postgresql_store_passes(monkeypatch):
    with scratch_database("iris_conn_test") as url:
        store = FederationStore.from_url(url)
        store.migrate()
        store.dispose()
        ok, message = _test(monkeypatch, url)
    assert ok and message.endswith(f"reachable, schema at the current migration ({head_revision()}).")

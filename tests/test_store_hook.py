"""The federation store hook: which database an Airflow connection names."""

from __future__ import annotations

import json

import pytest
from airflow.models.connection import Connection

from iris_airflow_provider.hooks import federation_store
from iris_airflow_provider.hooks.federation_store import FederationStoreHook, store_url_from_connection


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

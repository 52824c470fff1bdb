"""The Airflow connection to the federation store.

The store lives in its own database (never Airflow's metadata database, which task and trigger
code may not touch in Airflow 3), addressed by a connection, default ``iris_federation_default``.
Either form works::

    AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT='{"conn_type": "irisfederation", "host": "postgresql://u@db/iris"}'
    AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT='postgresql://u@db:5432/iris'

Without that connection, the store is SQLite at ``$AIRFLOW_HOME/iris_federation.db``, which is
fine for one machine; every process of a multi-machine deployment must share one store.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from airflow.configuration import get_airflow_home
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy.engine import URL, make_url

from iris_airflow_provider.store.engine import async_url
from iris_airflow_provider.store.store import FederationStore

ASYNC_URL_TTL_SECONDS = 30.0
_stores: dict[str, FederationStore] = {}
_async_urls: dict[str, tuple[float, str]] = {}  # conn id -> (when looked up, async URL)
_stores_lock = threading.Lock()


def default_store_url() -> str:
    """SQLite in Airflow's home (``AIRFLOW_HOME`` as Airflow itself reads it: ``~`` and ``$VARS`` expanded)."""
    return f"sqlite:///{os.path.join(get_airflow_home(), 'iris_federation.db')}"


def store_url_from_connection(conn: Any) -> str:
    """The SQLAlchemy URL a connection names: its host when that is a URL, else built from its parts."""
    host = conn.host or ""
    if "://" in host:
        return host
    if (conn.extra_dejson or {}).get("url"):
        return str(conn.extra_dejson["url"])
    drivername = {"postgres": "postgresql", "irisfederation": "sqlite"}.get(conn.conn_type, conn.conn_type)
    if make_url(f"{drivername}://").get_backend_name() == "sqlite":
        return URL.create("sqlite", database=conn.schema or host or None).render_as_string()
    return URL.create(
        drivername,
        username=conn.login or None,
        password=conn.password or None,
        host=host or None,
        port=conn.port,
        database=conn.schema or None,
    ).render_as_string(hide_password=False)


class FederationStoreHook(BaseHook):
    """Opens the federation store named by an Airflow connection (migrated on first use)."""

    conn_name_attr = "iris_federation_conn_id"
    default_conn_name = "iris_federation_default"
    conn_type = "irisfederation"
    hook_name = "Iris Federation Store"

    def __init__(self, iris_federation_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.iris_federation_conn_id = iris_federation_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login", "password", "port", "extra"],
            "relabeling": {"host": "SQLAlchemy URL"},
            "placeholders": {"host": "postgresql://user@db.example.com:5432/iris_federation"},
        }

    def get_url(self) -> str:
        try:
            conn = self.get_connection(self.iris_federation_conn_id)
        except AirflowNotFoundException:
            if self.iris_federation_conn_id != self.default_conn_name:
                raise
            return default_store_url()
        return store_url_from_connection(conn)

    async def aget_url(self) -> str:
        """The store's URL with a non-blocking driver, for code running in the triggerer.

        Cached for a little while per connection: thousands of triggers starting together would
        otherwise each look the connection up, stalling the triggerer's event loop for seconds.
        """
        cached = _async_urls.get(self.iris_federation_conn_id)
        if cached is not None and time.monotonic() - cached[0] < ASYNC_URL_TTL_SECONDS:
            return cached[1]
        url = await self._aget_url()
        _async_urls[self.iris_federation_conn_id] = (time.monotonic(), url)
        return url

    async def _aget_url(self) -> str:
        try:
            conn = await self.aget_connection(self.iris_federation_conn_id)
        except AirflowNotFoundException:
            if self.iris_federation_conn_id != self.default_conn_name:
                raise
            url = default_store_url()
        else:
            url = store_url_from_connection(conn)
        return async_url(url).render_as_string(hide_password=False)

    def get_store(self) -> FederationStore:
        return open_store(self.get_url())


def open_store(url: str) -> FederationStore:
    """One migrated store per URL per process: engines pool connections and are meant to be shared."""
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = FederationStore.from_url(url)
            store.migrate()
            _stores[url] = store
        return store

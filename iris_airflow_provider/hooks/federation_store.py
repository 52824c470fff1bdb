"""The Airflow connection to the federation store.

The store lives in its own database (never Airflow's metadata database, which task and trigger
code may not touch in Airflow 3), addressed by a connection, default ``iris_federation_default``.
Either form works::

    AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT='{"conn_type": "irisfederation", "host": "postgresql://u@db/iris"}'
    AIRFLOW_CONN_IRIS_FEDERATION_DEFAULT='postgresql://u@db:5432/iris'

Without that connection, the store is SQLite at ``$AIRFLOW_HOME/iris_federation.db``, which is
fine for one machine; every process of a multi-machine deployment must share one store.

The connection form (host relabelled "SQLAlchemy URL", the other fields hidden but the password) is
declared in the provider metadata (``get_provider_info``), which Airflow 3.3 reads without importing
this hook; :meth:`FederationStoreHook.test_connection` is the form's Test button.
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
from sqlalchemy.exc import ArgumentError, DBAPIError

from iris_airflow_provider import __version__
from iris_airflow_provider.store.engine import async_url, normalize_url
from iris_airflow_provider.store.migrate import head_revision, known_revisions
from iris_airflow_provider.store.store import FederationStore

ASYNC_URL_TTL_SECONDS = 30.0
TEST_CONNECT_TIMEOUT_SECONDS = 10  # the Test button waits in an api-server request
URL_EXAMPLES = "postgresql://user@db.example.com:5432/iris_federation or sqlite:////var/lib/iris/federation.db"
_stores: dict[str, FederationStore] = {}
_async_urls: dict[str, tuple[float, str]] = {}  # conn id -> (when looked up, async URL)
_stores_lock = threading.Lock()


def default_store_url() -> str:
    """SQLite in Airflow's home (``AIRFLOW_HOME`` as Airflow itself reads it: ``~`` and ``$VARS`` expanded)."""
    return f"sqlite:///{os.path.join(get_airflow_home(), 'iris_federation.db')}"


def store_url_from_connection(conn: Any) -> str:
    """The SQLAlchemy URL a connection names: its host when that is a URL, else built from its parts.

    A password in the connection's password field (encrypted by Airflow, or from a secrets backend)
    goes into a URL that has none, so the URL itself need not carry the secret.
    """
    host = conn.host or ""
    if "://" in host:
        if conn.password:
            url = make_url(host)
            if url.password is None:
                return url.set(password=conn.password).render_as_string(hide_password=False)
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

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's Test button (``POST /api/v2/connections/test``): can the store be
        opened, and is its schema at the current migration? It writes nothing: the schema is
        created or upgraded on first real use, not by a test."""
        try:
            url = self.get_url()
        except Exception as error:
            return False, f"Cannot read the connection {self.iris_federation_conn_id!r}: {error}"
        return check_store(url)


def check_store(url: str) -> tuple[bool, str]:
    """Whether the store at ``url`` can be opened and its schema used by this provider, and why."""
    try:
        parsed = normalize_url(url)
    except ArgumentError:
        return False, f"SQLAlchemy URL: {url!r} is not a URL; expected e.g. {URL_EXAMPLES}"
    shown = make_url(url).render_as_string(hide_password=True)  # as written, without its password
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        return False, f"SQLAlchemy URL: {shown} is a {backend} database; the store runs on postgresql or sqlite"
    engine_options: dict[str, Any] = {}
    if backend == "sqlite":
        problem = _sqlite_problem(parsed)
        if problem:
            return False, problem
    else:
        engine_options = {"connect_args": {"connect_timeout": TEST_CONNECT_TIMEOUT_SECONDS}}
    try:
        store = FederationStore.from_url(url, **engine_options)
        try:
            current = store.revision()
        finally:
            store.dispose()
    except Exception as error:  # whatever the driver raises: unreachable, refused, unknown database ...
        reason = error.orig if isinstance(error, DBAPIError) else error
        return False, f"Cannot open the federation store at {shown}: {' '.join(str(reason).split())}"
    head = head_revision()
    if current == head:
        return True, f"Federation store at {shown}: reachable, schema at the current migration ({head})."
    if current is None:
        return True, f"Federation store at {shown}: reachable and empty; its schema ({head}) is created on first use."
    if current in known_revisions():
        return (
            True,
            f"Federation store at {shown}: reachable, schema at migration {current}; upgraded to {head} on first use.",
        )
    return False, (
        f"Federation store at {shown}: its schema is at migration {current!r}, which iris-airflow-provider "
        f"{__version__} does not know (a newer provider version wrote it); upgrade the provider here."
    )


def _sqlite_problem(url: URL) -> str | None:
    """Why a SQLite URL cannot be a store the test may open without creating a file, if it cannot."""
    database = url.database or ""
    if database in ("", ":memory:"):
        return (
            f"SQLAlchemy URL: {url} is an in-memory database, which Airflow's processes cannot share; "
            f"expected e.g. {URL_EXAMPLES}"
        )
    if not os.path.isfile(database):
        return (
            f"SQLite database file {database!r} does not exist on this machine; "
            f"expected a SQLAlchemy URL such as {URL_EXAMPLES}"
        )
    return None


def open_store(url: str) -> FederationStore:
    """One migrated store per URL per process: engines pool connections and are meant to be shared."""
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = FederationStore.from_url(url)
            store.migrate()
            _stores[url] = store
        return store

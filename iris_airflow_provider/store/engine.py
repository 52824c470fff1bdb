"""Engines for the federation store: SQLite (WAL) embedded, PostgreSQL in production.

SQLite needs two things to be safe with several processes (scheduler, workers, triggerer,
api-server): WAL, so readers never block the writer, and ``BEGIN IMMEDIATE`` for write
transactions, so two writers queue on the lock instead of failing halfway with "database is locked".
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE = "iris_write"  # execution option marking a write transaction


def normalize_url(url: str | URL) -> URL:
    """Pin drivers: PostgreSQL through psycopg (v3), as SQLAlchemy 2.1 does by default."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def async_url(url: str | URL) -> URL:
    """The same database through a non-blocking driver, for triggers (aiosqlite / asyncpg)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if parsed.get_backend_name() == "postgresql":
        return parsed.set(drivername="postgresql+asyncpg")
    raise ValueError(f"unsupported federation store backend {parsed.get_backend_name()!r}; use sqlite or postgresql")


def create_store_engine(url: str | URL, **kwargs: Any) -> Engine:
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
    if backend == "postgresql":
        return sa.create_engine(parsed, pool_pre_ping=True, **kwargs)
    raise ValueError(f"unsupported federation store backend {backend!r}; use sqlite or postgresql")


def _sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
    install_sqlite_listeners(engine, url)
    return engine


def create_async_store_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """The same store through aiosqlite or asyncpg, with the same SQLite settings."""
    parsed = async_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_async_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
        install_sqlite_listeners(engine.sync_engine, parsed)
        return engine
    return create_async_engine(parsed, pool_pre_ping=True, **kwargs)


def install_sqlite_listeners(engine: Engine, url: URL) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        if url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        write = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

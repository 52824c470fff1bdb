"""The store fixtures of tests/store: each test on SQLite and, where it asks for ``store``, PostgreSQL too."""

from tests.store.conftest import postgres_store, postgres_url, sqlite_store, store

__all__ = ["postgres_store", "postgres_url", "sqlite_store", "store"]

"""The store fixtures of tests/store, for the peer tests."""

from tests.store.conftest import postgres_store, postgres_url, sqlite_store, store

__all__ = ["postgres_store", "postgres_url", "sqlite_store", "store"]

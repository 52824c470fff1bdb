"""Fixtures of the service tests: the store fixtures of tests/store (each test on SQLite and, where it
asks for ``store``, PostgreSQL too) and worlds built on them."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_airflow_provider.store.store import FederationStore
from tests.services.world import World
from tests.store.conftest import postgres_store, postgres_url, sqlite_store, store

__all__ = ["postgres_store", "postgres_url", "sqlite_store", "store"]


@pytest.fixture
def world(tmp_path: Path, store: FederationStore) -> Iterator[World]:
    world = World(tmp_path, store)
    yield world
    world.close()


@pytest.fixture
def lite(tmp_path: Path, sqlite_store: FederationStore) -> Iterator[World]:
    """The same world on SQLite only, for tests whose point is not the database."""
    world = World(tmp_path, sqlite_store)
    yield world
    world.close()


def _worlds(tmp_path: Path, store: FederationStore) -> Iterator[Callable[..., World]]:
    """Make worlds with other placement settings (timeouts, staleness); close them afterwards."""
    worlds: list[World] = []

    def make(**placement: Any) -> World:
        worlds.append(World(tmp_path, store, **placement))
        return worlds[-1]

    yield make
    for world in worlds:
        world.close()


@pytest.fixture
def lite_with(tmp_path: Path, sqlite_store: FederationStore) -> Iterator[Callable[..., World]]:
    """Worlds on SQLite with other placement settings."""
    yield from _worlds(tmp_path, sqlite_store)


@pytest.fixture
def world_with(tmp_path: Path, store: FederationStore) -> Iterator[Callable[..., World]]:
    """Worlds on SQLite and PostgreSQL with other placement settings."""
    yield from _worlds(tmp_path, store)

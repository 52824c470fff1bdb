"""The operator tests' federation: a world of scripted peers on a SQLite store, which the operator
module reaches through ``get_federation``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from iris_airflow_provider.operators import federated
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.store import FederationStore
from tests.services.world import World
from tests.store.conftest import sqlite_store

__all__ = ["sqlite_store"]


@pytest.fixture
def world(tmp_path: Path, sqlite_store: FederationStore) -> Iterator[World]:
    world = World(tmp_path, sqlite_store)
    yield world
    world.close()


@pytest.fixture
def federation(world: World, monkeypatch: pytest.MonkeyPatch) -> Federation:
    federation = world.federation()
    monkeypatch.setattr(federated, "get_federation", lambda conn_id=None: federation)
    return federation

"""The store fixtures of tests/store, and a receiving cluster behind the real peer API app."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from iris_airflow_provider.hooks import runtime
from iris_airflow_provider.peers.identity import TokenMinter, TokenVerifier, generate_keypair
from iris_airflow_provider.services.peer_auth import PeerAuthenticator
from iris_airflow_provider.store.store import FederationStore
from tests.receiving_peer import Peer, stop_all_jobs
from tests.store.conftest import postgres_store, postgres_url, sqlite_store, store

__all__ = ["postgres_store", "postgres_url", "sqlite_store", "store"]

MARIN_PRIVATE, MARIN_PUBLIC = generate_keypair()
OTHER_PRIVATE, OTHER_PUBLIC = generate_keypair()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def marin_token(audience: str = "cw-east") -> str:
    """A fresh token from cluster marin, for the cluster named ``audience``."""
    return TokenMinter("marin", MARIN_PRIVATE).mint(audience)


def serve_peer(tmp_path: Path, store: FederationStore, monkeypatch: pytest.MonkeyPatch) -> Peer:
    """Cluster cw-east (trusting marin and cw-west) behind the peer API app, on ``store``."""
    receiving = Peer(tmp_path, store)
    verifier = TokenVerifier("cw-east", {"marin": MARIN_PUBLIC, "cw-west": OTHER_PUBLIC})
    monkeypatch.setattr(runtime, "get_receiver", lambda start_run, serving_urls: receiving.receiver)
    monkeypatch.setattr(runtime, "get_peer_authenticator", lambda: PeerAuthenticator(verifier, store))
    return receiving


@pytest.fixture
def peer(tmp_path: Path, sqlite_store: FederationStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    receiving = serve_peer(tmp_path, sqlite_store, monkeypatch)
    yield receiving
    stop_all_jobs(receiving)


@pytest.fixture
def peer_on_each_store(tmp_path: Path, store: FederationStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    """The same, on SQLite and on PostgreSQL (which refuses what SQLite stores, such as a NUL)."""
    receiving = serve_peer(tmp_path, store, monkeypatch)
    yield receiving
    stop_all_jobs(receiving)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def serve() -> Iterator[object]:
    """Serve an ASGI app on a loopback port for the test; yields a function returning its URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(asgi: FastAPI) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)

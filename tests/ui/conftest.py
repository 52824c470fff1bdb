"""The Federation page's API in process: the real FastAPI app, Airflow's real auth manager and JWTs,
a real federation (SQLite store, process backends, agentless peers heartbeated for real).

The end-to-end tests (tests/e2e/test_federation_ui.py) do the same through a running api-server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iris_airflow_provider.backends.base import now_ms
from iris_airflow_provider.cluster.build import build_federation
from iris_airflow_provider.cluster.config import load_cluster_config
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.plugins import ui_api
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.records import NewIncarnation, Origin
from iris_airflow_provider.store.store import FederationStore

CLUSTER = """
name: marin
backends:
  - {{id: cpu, kind: process, max_running_jobs: 2}}
peers:
  - id: cw-h100
    kind: agentless
    backends: [{{id: default, kind: process, devices: {{h100: 8}}}}]
    allowed_submitters: ["*"]
  - id: cw-gb200
    kind: agentless
    backends: [{{id: default, kind: process, devices: {{gb200: 4}}}}]
    allowed_submitters: ["*"]
state_dir: {state_dir}
"""

TRAIN = "/alice/dag_a.run.manual__1"  # queued, 16 h100: no backend has that many
EVAL = "/bob/dag_b.run.manual__2"  # queued, 4 h100: fits on cw-h100 now
CLEANUP = "/script/cleanup"  # local, submitted by no DAG
RECEIVED = "/parent/received"  # handed to us by a peer


@pytest.fixture(scope="session")
def airflow_metadata() -> None:
    """Airflow's metadata database: token checks read its revoked-token table."""
    from airflow.utils.db import resetdb

    resetdb()


@pytest.fixture(scope="session")
def auth_manager(airflow_metadata: None) -> object:
    from airflow.api_fastapi.app import init_auth_manager

    return init_auth_manager()


@pytest.fixture(scope="session")
def token(auth_manager: object) -> Callable[..., str]:
    """A JWT for a user, signed by the auth manager exactly as ``POST /auth/token`` signs it."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    roles = {"admin": "admin", "alice": "user", "bob": "user", "viewer": "viewer", "carol": "user"}

    def make(user: str, **kwargs: int) -> str:
        return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=user, role=roles[user]), **kwargs)

    return make


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(state_dir=tmp_path / "iris"))
    config = load_cluster_config(tmp_path / "cluster.yaml")
    store = FederationStore.from_url(f"sqlite:///{tmp_path / 'federation.db'}")
    store.migrate()
    fed = build_federation(config, store)
    fed.peer_states(refresh_stale=True)  # real heartbeats of both peers' process backends
    now = now_ms()

    def gpu(job_id: str, variant: str, count: int, band: str = "interactive") -> object:
        device = {"type": "gpu", "variant": variant, "count": count}
        return parse_job({"job_id": job_id, "command": "true", "resources": {"device": device}, "priority_band": band})

    store.admit(
        NewIncarnation(
            gpu(TRAIN, "h100", 16, "batch"),
            direction=Direction.SENT,
            submitting_user="alice",
            origin=Origin("dag_a", "manual__1", "run"),
        ),
        now_ms=now - 4000,
    )
    store.admit(
        NewIncarnation(
            gpu(EVAL, "h100", 4),
            direction=Direction.SENT,
            submitting_user="bob",
            origin=Origin("dag_b", "manual__2", "run", 3),
        ),
        now_ms=now - 3000,
    )
    store.admit(
        NewIncarnation(
            parse_job({"job_id": CLEANUP, "command": "true"}),
            direction=Direction.LOCAL,
            submitting_user="ops",
            backend_id="cpu",
        ),
        now_ms=now - 2000,
    )
    store.admit(
        NewIncarnation(
            parse_job({"job_id": RECEIVED, "command": "true"}),
            direction=Direction.RECEIVED,
            submitting_user="dave",
            peer_id="parent",
            backend_id="cpu",
            nonce="abcdef0123456789",
        ),
        now_ms=now - 1000,
    )
    yield fed
    store.dispose()


@pytest.fixture
def client(federation: Federation, auth_manager: object) -> Iterator[TestClient]:
    ui_api.app.dependency_overrides[ui_api.federation] = lambda: federation
    with TestClient(ui_api.app) as test_client:
        yield test_client
    ui_api.app.dependency_overrides.clear()


@pytest.fixture
def as_user(client: TestClient, token: Callable[..., str]) -> Callable[[str], dict[str, str]]:
    return lambda user: {"Authorization": f"Bearer {token(user)}"}

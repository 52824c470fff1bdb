"""The peer API of a real api-server (cluster ``cw-east``, trusting ``marin``) under attack over HTTP:
replayed and misdirected tokens, a 300 MiB unauthenticated body, unauthenticated API documents,
and a fuzz of every route its OpenAPI document lists, with a valid token each time."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.peers.identity import TokenMinter, generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.ui_api import UI_PREFIX
from tests.e2e.conftest import free_port, save_logs
from tests.postgres import scratch_database

pytestmark = pytest.mark.e2e

MiB = 2**20
MARIN_PRIVATE, MARIN_PUBLIC = generate_keypair()


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    root = tmp_path_factory.mktemp("peer-api")
    (root / "marin.pub").write_text(MARIN_PUBLIC)
    (root / "cluster.yaml").write_text(
        f"""
name: cw-east
federation:
  trusted_peers: {{marin: {{public_key: {root / "marin.pub"}}}}}
  allowed_submitters: ["*@example.com"]
backends: [{{id: default, kind: process, devices: {{h100: 8}}}}]
"""
    )
    with scratch_database("iris_attack_meta") as metadata_url, scratch_database("iris_attack_store") as store_url:
        deployment = AirflowDeployment(
            home=root / "home",
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            cluster_config=root / "cluster.yaml",
            dags_folder=Path(__file__).parent / "dags",
        )
        try:
            deployment.start()
            deployment.wait_for_dag(RUNNER_DAG_ID)
            yield deployment
        finally:
            deployment.stop()
            save_logs(deployment, "peer-api-attacks")


def token(audience: str = "cw-east") -> str:
    return TokenMinter("marin", MARIN_PRIVATE).mint(audience)


def call(peer: AirflowDeployment, method: str, path: str, bearer: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {bearer}"} if bearer else {})}
    return httpx.request(method, f"{peer.base_url}{path}", headers=headers, timeout=120, **kwargs)


def refusal(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["message"])


def test_a_token_for_another_peer_is_refused(peer: AirflowDeployment) -> None:
    """marin's token for cw-west, captured there and replayed to cw-east, which also trusts marin."""
    says = refusal(call(peer, "GET", f"{API_PREFIX}/backends", token("cw-west")), 401)
    assert "meant for 'cw-west', not for this cluster ('cw-east')" in says


def test_a_captured_token_is_refused_even_after_the_api_server_restarts(peer: AirflowDeployment) -> None:
    captured = token()
    assert call(peer, "GET", f"{API_PREFIX}/backends", captured).status_code == 200
    assert "was already used" in refusal(call(peer, "POST", f"{API_PREFIX}/sync", captured, json={}), 401)
    peer.stop_component("api-server")
    peer.start_component("api-server")
    peer.wait_healthy()
    assert "was already used" in refusal(call(peer, "GET", f"{API_PREFIX}/backends", captured), 401)


def _peak_rss_of(session_id: int) -> dict[int, int]:
    """Peak resident memory (VmHWM, bytes) of every process in a session (a component and its workers)."""
    peaks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session_id:
                continue
            status = (entry / "status").read_text()
        except (OSError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks[int(entry.name)] = int(line.split()[1]) * 1024
    return peaks


def test_a_300_mib_unauthenticated_body_is_refused_without_being_held_in_memory(peer: AirflowDeployment) -> None:
    api_server = peer.processes["api-server"].pid
    before = _peak_rss_of(api_server)
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(300):
            sent += MiB
            yield b"x" * MiB

    headers = {"Content-Length": str(300 * MiB)}
    response = call(peer, "POST", f"{API_PREFIX}/handoffs", content=body(), headers=headers)
    assert "Authorization: Bearer" in refusal(response, 401) and sent == 300 * MiB
    after = _peak_rss_of(api_server)
    assert before, "no api-server process found"
    growth = {pid: after.get(pid, 0) - peak for pid, peak in before.items()}
    assert max(growth.values()) < 100 * MiB, growth


@pytest.mark.parametrize(
    "path",
    [
        f"{API_PREFIX}/openapi.json",
        f"{API_PREFIX}/docs",
        f"{API_PREFIX}/redoc",
        f"{UI_PREFIX}/openapi.json",
        f"{UI_PREFIX}/docs",
        f"{UI_PREFIX}/redoc",
    ],
)
def test_no_api_document_is_served_unauthenticated(peer: AirflowDeployment, path: str) -> None:
    response = call(peer, "GET", path)
    assert response.status_code in (401, 404), response.text
    assert "openapi" not in response.text.lower() and "swagger" not in response.text.lower()


def test_the_ui_apis_document_is_served_to_a_signed_in_user(peer: AirflowDeployment) -> None:
    response = call(peer, "GET", f"{UI_PREFIX}/openapi.json", peer.token("viewer"))
    assert response.status_code == 200 and "/api/jobs" in response.json()["paths"]


# The fuzz: every operation of the OpenAPI document, over HTTP, with a valid token ---------------------

text = st.text(max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def operations(peer: AirflowDeployment) -> list[tuple[str, str, list[str], bool]]:
    """(method, path, query parameter names, takes a body) of each operation the peer documents."""
    document = call(peer, "GET", f"{API_PREFIX}/openapi.json", token()).json()
    found = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            found.append((method.upper(), path, names, "requestBody" in operation))
    assert {path for _, path, _, _ in found} == {
        "/backends",
        "/handoffs",
        "/sync",
        "/terminate",
        "/logs",
        "/bundles/{digest}",
    }
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_input_to_any_documented_operation_is_a_200_or_a_4xx(
    peer: AirflowDeployment, operations: list[tuple[str, str, list[str], bool]], data: st.DataObject
) -> None:
    method, path, names, takes_body = data.draw(st.sampled_from(operations))
    params = data.draw(st.fixed_dictionaries({}, optional=dict.fromkeys(names, text)))
    content = data.draw(json_values.map(lambda value: json.dumps(value).encode()) | st.binary(max_size=100))
    response = call(peer, method, API_PREFIX + path, token(), params=params, content=content if takes_body else None)
    assert response.status_code < 500, (method, path, params, content, response.text)
    if response.status_code != 200:
        assert set(response.json()) == {"code", "message"}, response.text

"""Property-based fuzz of the peer API: with a valid token, any body or parameters on any route get
a 200 or a 4xx carrying a JSON ``{"code", "message"}``, never a 500 (the app raises nothing either:
the test client re-raises what the app does not handle).

Handoffs that pass every check are admitted but not started (the backend's start is stubbed out):
this fuzzes the HTTP surface and the receiver's checks, not running arbitrary commands.
tests/e2e/test_peer_federation.py runs the same properties against a served api-server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.hooks import runtime
from iris_airflow_provider.peers.wire import STATUS_OF
from iris_airflow_provider.plugins.peer_api import app
from tests.peers.conftest import bearer, marin_token
from tests.receiving_peer import Peer

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ERROR_STATUSES = {status for status in STATUS_OF.values() if status < 500} | {405}

text = st.text(max_size=40)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4)
)
# Near-miss values for each field: the real ones, broken ones, and anything at all.
job_ids = st.sampled_from(["/alice/train", "/alice/fuzz", "/a", "", "/alice/\x00", "../../x"]) | text
users = st.sampled_from(["alice@example.com", "ops-bot", "", "local_admin", "mallory@evil.org"]) | text
requesters = st.sampled_from(["marin", "cw-west", ""]) | text
spec_fields = st.fixed_dictionaries(
    {},
    optional={
        "command": st.sampled_from(["true", ["true"], ""]) | json_values,
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "cpu": json_values,
                "memory": json_values,
                "replicas": json_values,
                "device": st.fixed_dictionaries({}, optional={"type": json_values, "variant": json_values}),
            },
        )
        | json_values,
        "env": st.dictionaries(text, json_values, max_size=3) | json_values,
        "files": st.dictionaries(text, json_values, max_size=3) | json_values,
        "priority_band": json_values,
        "constraints": json_values,
        "parent_job_id": json_values,
    },
)
handoff_bodies = st.fixed_dictionaries(
    {},
    optional={
        "job_id": job_ids | json_values,
        "nonce": st.sampled_from(["n-fuzz", ""]) | json_values,
        "requester": requesters | json_values,
        "owner_principal": users | json_values,
        "submitting_user": users | json_values,
        "submitted_at_ms": st.integers() | json_values,
        "backend_id": st.sampled_from(["default", ""]) | json_values,
        "spec": spec_fields | json_values,
    },
)
# A handoff marin may make (its requester, an admitted user), of a fuzzed job: reaches the job model.
admissible_handoffs = st.fixed_dictionaries(
    {
        "job_id": st.integers(0, 10_000).map(lambda n: f"/alice/fuzz-{n}"),
        "nonce": st.uuids().map(lambda u: u.hex),
        "requester": st.just("marin"),
        "submitting_user": st.sampled_from(["alice@example.com", "ops-bot"]),
        "spec": spec_fields,
    },
    optional={"backend_id": st.sampled_from(["default", "elsewhere"]), "owner_principal": users},
)
raw_bodies = st.binary(max_size=200) | st.sampled_from([b"", b"{", b"[" * 5000, b"<html></html>", b'{"a":1e999}'])
log_cursors = st.sampled_from(["", "{}", '{"0": 0}', '{"0": -1}', "[]", "null", '{"0": 1e30}']) | text


@pytest.fixture
def client(peer_on_each_store: Peer, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    peer = peer_on_each_store
    bundles = BundleStore(peer.federation.config.bundle_store().directory, max_bundle_bytes=4096, chunk_bytes=100)
    monkeypatch.setattr(runtime, "get_bundle_store", lambda conn_id=None: bundles)
    peer.handoff()  # one real job of marin's, whose logs the cursors are tried on
    peer.wait_until_finished()
    peer.federation.start_received = lambda job_id, nonce: peer.store.get_job(job_id)  # type: ignore[method-assign]
    with TestClient(app) as test_client:
        yield test_client


def check(response: Any) -> None:
    # How deep the fuzz got, by answer (pytest --hypothesis-show-statistics).
    event(f"{response.status_code} {response.json().get('code', '')}")
    assert response.status_code == 200 or response.status_code in ERROR_STATUSES, (
        response.status_code,
        response.text,
    )
    body = response.json()
    if response.status_code != 200:
        assert set(body) == {"code", "message"} and body["message"], body


def post(client: TestClient, path: str, body: Any) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    check(client.post(path, content=content, headers=bearer(marin_token())))


@FUZZ
@given(body=admissible_handoffs | handoff_bodies | json_values | raw_bodies)
def test_any_handoff_body_is_a_200_or_a_4xx(client: TestClient, body: Any) -> None:
    post(client, "/handoffs", body)


@FUZZ
@given(body=st.fixed_dictionaries({}, optional={"cursor": st.from_regex(r"[0-9]{0,25}") | json_values}) | raw_bodies)
def test_any_sync_body_is_a_200_or_a_4xx(client: TestClient, body: Any) -> None:
    post(client, "/sync", body)


@FUZZ
@given(
    body=st.fixed_dictionaries({}, optional={"job_id": job_ids | json_values, "nonce": json_values})
    | json_values
    | raw_bodies
)
def test_any_terminate_body_is_a_200_or_a_4xx(client: TestClient, body: Any) -> None:
    post(client, "/terminate", body)


@FUZZ
@given(
    params=st.fixed_dictionaries(
        {},
        optional={
            "job_id": job_ids,
            "cursor": log_cursors,
            "max_lines": st.integers(-10, 10_000).map(str) | text,
        },
    ),
    extra=st.dictionaries(text, text, max_size=2),
)
def test_any_logs_parameters_are_a_200_or_a_4xx(
    client: TestClient, params: dict[str, str], extra: dict[str, str]
) -> None:
    check(client.get("/logs", params={**extra, **params}, headers=bearer(marin_token())))


@FUZZ
@given(
    method=st.sampled_from(["GET", "PUT"]),
    digest=st.sampled_from(["sha256:" + "ab" * 32, "sha256:" + "AB" * 32, "md5:00", ""]) | text,
    params=st.fixed_dictionaries(
        {}, optional={"size": st.integers(-5, 5000).map(str) | text, "offset": st.integers(-5, 200).map(str) | text}
    ),
    body=raw_bodies,
)
def test_any_bundle_call_is_a_200_a_4xx_or_a_503_to_send_again(
    client: TestClient, method: str, digest: str, params: dict[str, str], body: bytes
) -> None:
    path = f"/bundles/{quote(digest, safe='')}"
    response = client.request(method, path, params=params, content=body, headers=bearer(marin_token()))
    if response.status_code == 503:  # another writer, a stale offset, or bytes not of the digest: send again
        assert response.json()["code"] == "unavailable", response.text
        return
    if response.status_code == 404 and "/" in digest:  # no such route: Starlette's own answer
        return
    check(response)


@FUZZ
@given(path=st.sampled_from(["/backends", "/handoffs", "/sync", "/terminate", "/logs", "/openapi.json"]))
def test_any_route_with_any_method_is_a_200_or_a_4xx(client: TestClient, path: str) -> None:
    for method in ("GET", "POST", "PUT", "DELETE"):
        check(client.request(method, path, content=b"{}", headers=bearer(marin_token())))

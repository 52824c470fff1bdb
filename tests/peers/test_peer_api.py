"""The peer API as an attacker meets it, in process (the real app, verifier, store and receiver):
nothing is read before the caller is authenticated, a body is read up to its route's limit and no
further, every token is for one receiver and one use, and bad input is a 4xx naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from iris_airflow_provider.peers.wire import HANDOFF_BODY_LIMIT, SMALL_BODY_LIMIT
from iris_airflow_provider.plugins.peer_api import app
from iris_airflow_provider.services import peer_auth
from tests.peers.conftest import bearer, marin_token
from tests.receiving_peer import Peer

MiB = 2**20


class Body:
    """A request body produced lazily, chunk by chunk, counting how much the server pulled."""

    def __init__(self, size: int, chunk: int = MiB) -> None:
        self.size = size
        self.chunk = chunk
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.pulled < self.size:
            piece = min(self.chunk, self.size - self.pulled)
            self.pulled += piece
            yield b"x" * piece


async def call(method: str, path: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {**kwargs.pop("headers", {}), **(bearer(token) if token else {})}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cw-east") as client:
        return await client.request(method, path, headers=headers, **kwargs)


def refusal(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code
    return str(body["message"])


# Nothing read before authentication; bodies bounded per route ------------------------------------


@pytest.mark.parametrize("path", ["/handoffs", "/sync", "/terminate"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_300_mib_unauthenticated_body_is_refused_without_being_read(
    peer: Peer, path: str, declared: bool
) -> None:
    body = Body(300 * MiB)
    headers = {"Content-Length": str(body.size)} if declared else {}
    response = await call("POST", path, content=body, headers=headers)
    assert "Authorization: Bearer" in refusal(response, 401, "unauthenticated")
    assert body.pulled == 0


async def test_an_authenticated_body_over_its_routes_limit_is_a_413_read_no_further(peer: Peer) -> None:
    declared = Body(HANDOFF_BODY_LIMIT + 1)
    response = await call(
        "POST", "/handoffs", marin_token(), content=declared, headers={"Content-Length": str(declared.size)}
    )
    says = refusal(response, 413, "payload_too_large")
    assert says == f"the body of POST /handoffs may be at most {HANDOFF_BODY_LIMIT} bytes; this one is larger"
    assert declared.pulled == 0  # refused on its Content-Length

    chunked = Body(300 * MiB)
    response = await call("POST", "/handoffs", marin_token(), content=chunked)
    refusal(response, 413, "payload_too_large")
    assert chunked.pulled <= HANDOFF_BODY_LIMIT + 2 * MiB  # stopped as soon as it passed the limit

    for path in ("/sync", "/terminate"):
        small = Body(SMALL_BODY_LIMIT + 1, chunk=4096)
        says = refusal(await call("POST", path, marin_token(), content=small), 413, "payload_too_large")
        assert f"at most {SMALL_BODY_LIMIT} bytes" in says and small.pulled <= SMALL_BODY_LIMIT + 4096
    assert peer.store.list_jobs(limit=10) == []


async def test_a_handoff_with_files_at_their_limit_fits_the_body_limit(peer: Peer) -> None:
    """The worst case an honest parent sends: 10 MiB of text files that JSON escapes six-fold."""
    files = {f"f{n}.txt": "\x01" * (MiB - 100) for n in range(10)}
    body = {
        "job_id": "/alice/big",
        "nonce": "n1",
        "requester": "marin",
        "submitting_user": "alice@example.com",
        "spec": {"command": "true", "files": files},
    }
    content = json.dumps(body).encode()
    assert len(content) < HANDOFF_BODY_LIMIT
    response = await call("POST", "/handoffs", marin_token(), content=content)
    assert response.status_code != 413, response.text


# Tokens: one receiver, one use ------------------------------------------------------------------------


async def test_a_token_meant_for_another_peer_is_refused(peer: Peer) -> None:
    """marin's token for cw-west, captured there and presented to cw-east, which trusts marin too."""
    says = refusal(await call("GET", "/backends", marin_token("cw-west")), 401, "unauthenticated")
    assert "meant for 'cw-west', not for this cluster ('cw-east')" in says


async def test_a_captured_token_cannot_be_replayed_on_any_route(peer: Peer) -> None:
    token = marin_token()
    assert (await call("GET", "/backends", token)).status_code == 200
    for method, path, kwargs in [
        ("GET", "/backends", {}),
        ("POST", "/sync", {"json": {"cursor": ""}}),
        ("POST", "/terminate", {"json": {"job_id": "/alice/train"}}),
        ("GET", "/logs", {"params": {"job_id": "/alice/train"}}),
        ("POST", "/handoffs", {"json": {}}),
    ]:
        says = refusal(await call(method, path, token, **kwargs), 401, "unauthenticated")
        assert "was already used" in says and "every call needs a fresh token" in says


async def test_a_peer_calling_faster_than_the_store_remembers_is_told_to_wait(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_auth, "MAX_LIVE_TOKENS_PER_PEER", 2)
    for _ in range(2):
        assert (await call("GET", "/backends", marin_token())).status_code == 200
    says = refusal(await call("GET", "/backends", marin_token()), 503, "unavailable")
    assert (
        says
        == "peer 'marin' already has 2 unexpired tokens here, the most allowed: it calls too often, try again later"
    )


async def test_a_refused_body_still_spends_its_token(peer: Peer) -> None:
    token = marin_token()
    refusal(await call("POST", "/sync", token, content=b"not json"), 400, "invalid_argument")
    refusal(await call("POST", "/sync", token, json={"cursor": ""}), 401, "unauthenticated")


# Malformed input is a 400 naming what is wrong -------------------------------------------------------


@pytest.mark.parametrize(
    ("cursor", "says"),
    [
        ("abc", "body.cursor: must be empty or a cursor this peer returned"),
        ("²", "body.cursor: must be empty or a cursor this peer returned"),  # a digit to str.isdigit, not to int()
        ("12\x00", "body.cursor: must be empty or a cursor this peer returned"),
        ("9" * 30, "body.cursor: String should have at most 19 characters"),
        (7, "body.cursor: must be a string"),
        (None, "body.cursor: must be a string"),
    ],
)
async def test_a_malformed_sync_cursor_is_a_400(peer: Peer, cursor: object, says: str) -> None:
    assert says in refusal(await call("POST", "/sync", marin_token(), json={"cursor": cursor}), 400, "invalid_argument")


async def test_a_cursor_far_ahead_of_this_store_is_a_full_snapshot(peer: Peer) -> None:
    response = await call("POST", "/sync", marin_token(), json={"cursor": "9" * 19})
    assert response.status_code == 200 and response.json()["cursor_stale"] is True


@pytest.mark.parametrize(
    "cursor",
    ["not json", "[]", '{"0": -1}', '{"0": "7"}', '{"0": 1.5}', '{"0": 99999999999999999999999}', "[" * 5000],
)
async def test_a_malformed_log_cursor_is_a_400(peer: Peer, cursor: str) -> None:
    peer.handoff()
    params = {"job_id": "/alice/train", "cursor": cursor}
    says = refusal(await call("GET", "/logs", marin_token(), params=params), 400, "invalid_argument")
    assert "is not a log cursor this cluster returned" in says


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"job_id": "/alice/train\x00"}, "job_id: must not contain control characters (such as NUL)"),
        ({"job_id": "/alice/train", "cursor": "{}\x1b"}, "cursor: must not contain control characters"),
        ({"job_id": ""}, "job_id: String should have at least 1 character"),
        ({}, "job_id: is required"),
        ({"job_id": "/a/b", "max_lines": "0"}, "max_lines: must be >= 1"),
        ({"job_id": "/a/b", "max_lines": "5001"}, "max_lines: must be <= 5000"),
        ({"job_id": "/a/b", "max_lines": "many"}, "max_lines: must be an integer"),
    ],
)
async def test_bad_log_parameters_are_a_400_naming_the_parameter(peer: Peer, params: dict[str, str], says: str) -> None:
    assert says in refusal(await call("GET", "/logs", marin_token(), params=params), 400, "invalid_argument")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "body: Invalid JSON"),
        (b"<html>hello</html>", "body: Invalid JSON"),
        (b"[]", "body: must be an object"),
        (b"[" * 60_000, "body: "),  # deeper than any parser recurses, within the 64 KiB limit
        (b'{"job_id": "/alice/x\\u0000", "nonce": "n"}', "body.job_id: must look like /<user>/<name>"),
        (b'{"job_id": "/alice/x", "nonce": "n\\n"}', "body.nonce: must not contain control characters"),
    ],
)
async def test_a_malformed_terminate_body_is_a_400(peer: Peer, body: bytes, says: str) -> None:
    assert says in refusal(await call("POST", "/terminate", marin_token(), content=body), 400, "invalid_argument")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("requester", "marin\x00", "body.requester: must not contain control characters"),
        ("submitting_user", "alice@example.com\r\n", "body.submitting_user: must not contain control characters"),
        ("submitted_at_ms", 2**70, "body.submitted_at_ms: must be <= 9223372036854775807"),
        ("nonce", "", "body.nonce: String should have at least 1 character"),
        ("spec", "echo hi", "body.spec: must be an object"),
        # PostgreSQL's jsonb cannot hold a NUL: refused here, not a 500 from the store.
        ("spec", {"command": "true", "env": {"A": "x\x00"}}, "body.spec: spec.env.A must not contain a NUL character"),
        ("spec", {"command": ["true", "\x00"]}, "spec.command[1] must not contain a NUL character"),
    ],
)
async def test_a_malformed_handoff_envelope_is_a_400_and_nothing_is_admitted(
    peer: Peer, field: str, value: object, says: str
) -> None:
    body = {
        "job_id": "/alice/train",
        "nonce": "n1",
        "requester": "marin",
        "submitting_user": "alice@example.com",
        "spec": {"command": "true"},
        field: value,
    }
    assert says in refusal(await call("POST", "/handoffs", marin_token(), json=body), 400, "invalid_argument")
    assert peer.store.list_jobs(limit=10) == []


# The API's description -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
async def test_there_is_no_docs_page(peer: Peer, path: str) -> None:
    assert (await call("GET", path)).status_code == 404
    assert (await call("GET", path, marin_token())).status_code == 404


async def test_the_openapi_document_is_for_authenticated_peers_only(peer: Peer) -> None:
    refusal(await call("GET", "/openapi.json"), 401, "unauthenticated")
    document = (await call("GET", "/openapi.json", marin_token())).json()
    assert set(document["paths"]) == {"/backends", "/handoffs", "/sync", "/terminate", "/logs", "/bundles/{digest}"}
    # Bodies are read by the routes themselves, yet documented as if declared.
    body = document["paths"]["/handoffs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"job_id", "nonce", "requester", "spec"} <= set(body["required"])

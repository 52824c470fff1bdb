"""A trusted peer that lies: the parent reads no more of an answer than its route allows, accepts
no more items than it asked for or the wire allows, and turns anything malformed (an HTML page, a
NUL, a wrong shape) into a PeerError naming the peer and what was wrong, never a parse error."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.peers import airflow_peer
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import TokenMinter
from iris_airflow_provider.peers.wire import ANSWER_LIMITS, MAX_BACKENDS, MAX_SYNC_DELTAS, logs_answer_limit
from tests.peers.conftest import MARIN_PRIVATE

MiB = 2**20
JOB = "/alice/train"


class Answer:
    """An answer produced lazily, chunk by chunk, counting how much the parent pulled."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.pulled += len(chunk)
            yield chunk


def lying(answer: Callable[[httpx.Request], httpx.Response]) -> AirflowPeer:
    return AirflowPeer(
        "cw-east", "https://cw-east.example", TokenMinter("marin", MARIN_PRIVATE), transport=httpx.MockTransport(answer)
    )


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(PeerError) as caught:
        call()
    assert caught.value.code is PeerErrorCode.UNAVAILABLE, caught.value  # retried, like an unreachable peer
    return caught.value.message


def json_answer(document: Any, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json=document)


CALLS: dict[str, Callable[[AirflowPeer], object]] = {
    "/backends": lambda peer: peer.heartbeat(),
    "/handoffs": lambda peer: peer.deliver(handoff()),
    "/sync": lambda peer: peer.sync([JOB], ""),
    "/terminate": lambda peer: peer.cancel(JOB),
    "/logs": lambda peer: peer.logs(JOB, "", 500),
}


def handoff(**spec: Any) -> Handoff:
    return Handoff(JOB, "n1", parse_job({"job_id": JOB, "command": "true", **spec}), "", "marin", "a", "a", 1)


@pytest.mark.parametrize("path", CALLS)
def test_an_html_200_is_a_peer_error_naming_the_peer_and_route(path: str) -> None:
    page = lambda request: httpx.Response(200, html="<html><body>Sign in to continue</body></html>")  # noqa: E731
    says = refused(lambda: CALLS[path](lying(page)))
    assert says.startswith(
        f"peer cw-east answered {path} with 200 (text/html; charset=utf-8) and a body that is not JSON"
    )
    assert "Sign in to continue" in says


@pytest.mark.parametrize("path", CALLS)
def test_an_answer_over_its_routes_limit_is_refused_having_read_no_more_than_the_limit(path: str) -> None:
    limit = logs_answer_limit(500) if path == "/logs" else ANSWER_LIMITS[path]
    answer = Answer(b"x" * MiB for _ in range(300))  # 300 MiB, no Content-Length: read until it is too much
    says = refused(lambda: CALLS[path](lying(lambda request: httpx.Response(200, content=answer))))
    assert f"an answer of more than the {limit} bytes allowed" in says
    assert answer.pulled <= limit + MiB


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    answer = Answer(b"x" * MiB for _ in range(300))

    def huge(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Length": str(300 * MiB)}, content=answer)

    says = refused(lambda: lying(huge).heartbeat())
    assert f"an answer of {300 * MiB} bytes, more than the {ANSWER_LIMITS['/backends']} allowed" in says
    assert answer.pulled == 0


def test_a_compressed_answer_is_bounded_by_its_decompressed_size() -> None:
    bomb = gzip.compress(b"[" + b" " * (200 * MiB) + b"]")  # 200 kB on the wire, 200 MiB unpacked

    def compressed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=bomb)

    assert f"more than the {ANSWER_LIMITS['/handoffs']} bytes allowed" in refused(
        lambda: lying(compressed).deliver(handoff())
    )


def test_more_log_lines_than_asked_for_are_refused() -> None:
    """20,000 short lines when 500 were asked: within the byte limit, refused by count."""
    lines = [f"line {n}" for n in range(20_000)]
    says = refused(lambda: lying(json_answer({"lines": lines, "next_cursor": "{}"})).logs(JOB, "", 500))
    assert says == "peer cw-east answered 20000 log lines of /alice/train when at most 500 were asked for"


def test_26_mib_of_log_lines_when_500_were_asked_is_refused_by_size() -> None:
    lines = ["y" * 1300 for _ in range(20_000)]
    document = json.dumps({"lines": lines, "next_cursor": "{}"}).encode()
    assert len(document) > logs_answer_limit(500)
    says = refused(lambda: lying(lambda request: httpx.Response(200, content=document)).logs(JOB, "", 500))
    assert f"an answer of {len(document)} bytes, more than the {logs_answer_limit(500)} allowed" in says


def test_more_backends_than_a_heartbeat_may_carry_are_refused() -> None:
    backends = [{"backend_id": f"b{n}", "kind": "process"} for n in range(MAX_BACKENDS + 1)]
    says = refused(lambda: lying(json_answer({"cluster": "cw-east", "backends": backends})).heartbeat())
    assert says == f"peer cw-east advertised {MAX_BACKENDS + 1} backends, more than the {MAX_BACKENDS} allowed"


def test_a_malformed_backend_is_a_peer_error_naming_the_field() -> None:
    backend = {"backend_id": "b", "availability": {"version": 2, "observation_epoch_ms": -1}}
    says = refused(lambda: lying(json_answer({"cluster": "cw-east", "backends": [backend]})).heartbeat())
    assert says.startswith("peer cw-east advertised a malformed backend: backends.availability.observation_epoch_ms")


def test_more_sync_changes_than_the_wire_allows_are_refused() -> None:
    deltas = [{"job_id": f"/a/{n}", "nonce": "n", "state": "running"} for n in range(MAX_SYNC_DELTAS + 1)]
    says = refused(lambda: lying(json_answer({"deltas": deltas, "next_cursor": "1"})).sync([JOB], ""))
    assert f"with {MAX_SYNC_DELTAS + 1} changes, more than the {MAX_SYNC_DELTAS} allowed" in says


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"deltas": "everything", "next_cursor": "1"}, "JSON not of the expected shape (deltas: must be a list)"),
        ({"deltas": [{"job_id": JOB, "nonce": "n", "state": "exploded"}], "next_cursor": "1"}, "deltas[0].state"),
        ({"next_cursor": "1"}, "deltas: is required"),
        ({"deltas": [], "next_cursor": "x" * 10_000_000}, "next_cursor: "),  # kept by the parent: bounded
        (  # a number the parent's store could not hold
            {"deltas": [{"job_id": JOB, "nonce": "n", "state": "failed", "exit_code": 2**70}], "next_cursor": "1"},
            "deltas[0].exit_code: must be <= 2147483647",
        ),
        ([], "must be an object"),
        (
            {"deltas": [{"job_id": "/a/\u0000", "nonce": "n", "state": "running"}], "next_cursor": "1"},
            "a NUL character in its JSON (at deltas[0].job_id)",
        ),
    ],
)
def test_a_sync_answer_of_the_wrong_shape_is_a_peer_error(document: Any, says: str) -> None:
    message = refused(lambda: lying(json_answer(document)).sync([JOB], ""))
    assert message.startswith("peer cw-east answered /sync with 200 (application/json) and ") and says in message


def test_a_refusal_with_a_huge_or_foreign_body_is_classified_by_status_and_cut() -> None:
    answer = Answer(b"<html>" + b"z" * MiB for _ in range(100))
    with pytest.raises(PeerError) as caught:
        lying(lambda request: httpx.Response(403, content=answer)).deliver(handoff())
    assert caught.value.code is PeerErrorCode.PERMISSION_DENIED
    assert answer.pulled <= 2 * MiB and len(caught.value.message) < 400
    long_message = {"code": "invalid_argument", "message": "m" * 100_000}
    with pytest.raises(PeerError) as caught:
        lying(lambda request: httpx.Response(400, content=json.dumps(long_message))).deliver(handoff())
    assert caught.value.code is PeerErrorCode.INVALID_ARGUMENT  # cut at 64 KiB: classified by its status
    assert caught.value.message.startswith('peer cw-east answered 400: \'{"code"')
    with pytest.raises(PeerError) as caught:
        lying(json_answer({"code": "invalid_argument", "message": "m" * 10_000}, 400)).deliver(handoff())
    assert caught.value.message == "m" * 2_000 + " [cut]"


def test_a_handoff_larger_than_a_peer_accepts_is_refused_before_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(airflow_peer, "HANDOFF_BODY_LIMIT", 4096)
    sent: list[httpx.Request] = []
    peer = lying(lambda request: sent.append(request) or httpx.Response(500))
    with pytest.raises(PeerError) as caught:
        peer.deliver(handoff(env={"BIG": "b" * 5000}))
    assert caught.value.code is PeerErrorCode.PAYLOAD_TOO_LARGE and caught.value.terminal
    assert "more than the 4096 a peer accepts" in caught.value.message and sent == []


def test_every_call_carries_a_fresh_token_for_this_peer_alone() -> None:
    tokens: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        tokens.append(request.headers["Authorization"].removeprefix("Bearer "))
        return httpx.Response(200, json={"cluster": "cw-east", "backends": []})

    peer = lying(record)
    peer.heartbeat()
    peer.heartbeat()
    claims = [__import__("jwt").decode(t, options={"verify_signature": False}) for t in tokens]
    assert [c["aud"] for c in claims] == ["cw-east", "cw-east"] and claims[0]["jti"] != claims[1]["jti"]


def test_an_html_200_over_real_http_is_a_peer_error(serve) -> None:  # type: ignore[no-untyped-def]
    proxy = FastAPI()

    @proxy.api_route("/{path:path}", methods=["GET", "POST"])
    def login_page(path: str) -> Response:  # a single-sign-on proxy in front of the api-server
        return Response("<html>Please log in</html>", media_type="text/html")

    peer = AirflowPeer("cw-east", serve(proxy), TokenMinter("marin", MARIN_PRIVATE), allow_insecure_http=True)
    for call in CALLS.values():
        assert "a body that is not JSON: '<html>Please log in</html>'" in refused(lambda: call(peer))  # noqa: B023


def test_plain_http_is_refused_unless_allowed() -> None:
    with pytest.raises(ValueError, match=r"set allow_insecure_http: true on the peer"):
        AirflowPeer("cw-east", "http://cw-east.example", TokenMinter("marin", MARIN_PRIVATE))
    assert AirflowPeer("cw-east", "http://127.0.0.1:1", TokenMinter("marin", MARIN_PRIVATE), allow_insecure_http=True)


def test_a_long_error_in_a_report_is_cut() -> None:
    delta = {"job_id": JOB, "nonce": "n", "state": "failed", "error": "e" * 1_000_000}
    result = lying(json_answer({"deltas": [delta], "next_cursor": "1"})).sync([JOB], "")
    assert len(result.reports[JOB].error) == 8 * 2**10 and result.reports[JOB].error.endswith(" [cut]")

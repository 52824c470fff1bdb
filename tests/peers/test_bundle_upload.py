"""A workdir bundle's way to an Airflow peer over real HTTP (the peer API served by uvicorn, real
tokens, a real receiving cluster and process backend): authenticated and bounded before any body
is read, deduplicated by digest, resumed after a cut connection, verified at the end, unpacked
into the job's workdir where the job reads it; a backend that cannot take it refuses, to be requeued."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI

from iris_airflow_provider.backends.bundles import BundleSettings, BundleStore
from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.handoff_policy import DeliveryError
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.hooks import runtime
from iris_airflow_provider.operators.workdir import bundle_workdir
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import TokenMinter
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.peer_api import app
from iris_airflow_provider.services.delivery import error_kind
from tests.peers.conftest import MARIN_PRIVATE, marin_token
from tests.peers.test_airflow_peer import handoff
from tests.peers.test_peer_api import Body, call, refusal
from tests.receiving_peer import Peer

KiB, MiB = 2**10, 2**20
CHUNK = 256 * KiB  # the peer's bundles.chunk_bytes in these tests: a bundle of 1 MiB is several chunks


@pytest.fixture
def peer_bundles(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> BundleStore:
    """The receiving cluster's bundle store (its cluster file's, with a small chunk limit)."""
    store = BundleStore(peer.federation.config.bundle_store().directory, max_bundle_bytes=8 * MiB, chunk_bytes=CHUNK)
    monkeypatch.setattr(runtime, "get_bundle_store", lambda conn_id=None: store)
    return store


@pytest.fixture
def url(peer: Peer, peer_bundles: BundleStore, serve) -> str:  # type: ignore[no-untyped-def]
    api_server = FastAPI()
    api_server.mount(API_PREFIX, app)
    return str(serve(api_server))


class Counting(httpx.HTTPTransport):
    """The parent's HTTP transport, counting what it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []  # (method, body bytes)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, len(request.content)))
        return super().handle_request(request)


@pytest.fixture
def parent_bundles(tmp_path: Path) -> BundleStore:
    return BundleStore(tmp_path / "parent-bundles", chunk_bytes=1 * MiB)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    root.mkdir()
    (root / "data.bin").write_bytes(os.urandom(MiB + 12345))
    (root / "read.sh").write_text('#!/bin/sh\nsha256sum data.bin | cut -d" " -f1\n')
    (root / "read.sh").chmod(0o755)
    return root


def marin(url: str, bundles: BundleStore, transport: httpx.BaseTransport | None = None) -> AirflowPeer:
    minter = TokenMinter("marin", MARIN_PRIVATE)
    return AirflowPeer("cw-east", url, minter, allow_insecure_http=True, bundles=bundles, transport=transport)


def ref_of(data: bytes) -> BundleRef:
    return BundleRef(digest="sha256:" + hashlib.sha256(data).hexdigest(), size=len(data))


# Authenticated and bounded before any body is read --------------------------------------------------


async def test_an_unauthenticated_chunk_is_refused_without_being_read(peer_bundles: BundleStore) -> None:
    ref = ref_of(b"x")
    body = Body(300 * MiB)
    path = f"/bundles/{ref.digest}"
    response = await call("PUT", path, params={"size": ref.size, "offset": 0}, content=body)
    assert "Authorization: Bearer" in refusal(response, 401, "unauthenticated")
    assert body.pulled == 0
    assert refusal(await call("GET", path, params={"size": 1}), 401, "unauthenticated")
    assert peer_bundles.received(ref) == 0 and not peer_bundles.partial_path(ref).exists()


async def test_a_chunk_over_the_peers_chunk_limit_is_a_413_read_no_further(peer_bundles: BundleStore) -> None:
    ref = BundleRef(digest="sha256:" + "1" * 64, size=4 * MiB)
    body = Body(CHUNK + 1)
    response = await call(
        "PUT",
        f"/bundles/{ref.digest}",
        marin_token(),
        params={"size": ref.size, "offset": 0},
        content=body,
        headers={"Content-Length": str(body.size)},
    )
    assert f"at most {CHUNK} bytes" in refusal(response, 413, "payload_too_large")
    assert body.pulled == 0 and peer_bundles.received(ref) == 0
    chunked = Body(CHUNK)  # no Content-Length: the peer cannot bound it before reading
    response = await call(
        "PUT", f"/bundles/{ref.digest}", marin_token(), params={"size": 4 * MiB, "offset": 0}, content=chunked
    )
    assert "needs a Content-Length" in refusal(response, 400, "invalid_argument")
    assert chunked.pulled == 0


async def test_a_bundle_larger_than_the_peer_takes_is_resource_exhausted_and_a_bad_digest_a_400(
    peer_bundles: BundleStore,
) -> None:
    digest = "sha256:" + "2" * 64
    for method in ("GET", "PUT"):
        response = await call(
            method, f"/bundles/{digest}", marin_token(), params={"size": 9 * MiB, "offset": 0}, content=b"x"
        )
        says = refusal(response, 429, "resource_exhausted")
        assert (
            says == f"bundle {digest} is {9 * MiB} bytes, more than the {8 * MiB} this cluster takes "
            "(bundles.max_bundle_bytes)"
        )
    response = await call("GET", "/bundles/md5:abc", marin_token(), params={"size": 1})
    assert "digest: must be sha256:<64 lowercase hex digits>" in refusal(response, 400, "invalid_argument")


# The upload itself ---------------------------------------------------------------------------------


def test_a_bundle_is_uploaded_in_chunks_once_and_a_second_time_nothing_is_sent(
    url: str, parent_bundles: BundleStore, peer_bundles: BundleStore, workdir: Path
) -> None:
    ref = bundle_workdir(workdir, parent_bundles)
    transport = Counting()
    status = marin(url, parent_bundles, transport).upload_bundle(ref)
    assert status.complete and status.received == ref.size
    assert peer_bundles.path(ref).read_bytes() == parent_bundles.path(ref).read_bytes()
    puts = [size for method, size in transport.calls if method == "PUT"]
    assert len(puts) == -(-ref.size // CHUNK) and all(size <= CHUNK for size in puts)  # the peer's chunk limit
    assert sum(puts) == ref.size

    again = Counting()
    assert marin(url, parent_bundles, again).upload_bundle(ref).complete
    assert again.calls == [("GET", 0)]  # deduplicated by digest: nothing re-sent


def test_an_upload_cut_mid_chunk_resumes_from_the_bytes_the_peer_has(
    url: str, parent_bundles: BundleStore, peer_bundles: BundleStore, workdir: Path
) -> None:
    ref = bundle_workdir(workdir, parent_bundles)
    data = parent_bundles.path(ref).read_bytes()
    # A parent whose connection is cut a third of the way into its first chunk.
    address = urlsplit(url)
    sent = CHUNK // 3
    with socket.create_connection((address.hostname, address.port)) as cut:
        head = (
            f"PUT {API_PREFIX}/bundles/{ref.digest}?size={ref.size}&offset=0 HTTP/1.1\r\n"
            f"Host: {address.netloc}\r\nAuthorization: Bearer {marin_token()}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {CHUNK}\r\n\r\n"
        )
        cut.sendall(head.encode() + data[:sent])
    from tests.waiting import wait_for

    # The peer keeps what arrived (its handler notices the disconnect and lets go of the upload).
    wait_for(lambda: peer_bundles.received(ref) == sent and _unlocked(peer_bundles, ref), "the cut chunk's bytes")
    assert not peer_bundles.has(ref)
    transport = Counting()
    assert marin(url, parent_bundles, transport).upload_bundle(ref).complete
    assert sum(size for method, size in transport.calls if method == "PUT") == ref.size - sent  # only the rest
    assert peer_bundles.path(ref).read_bytes() == data


def _unlocked(store: BundleStore, ref: BundleRef) -> bool:
    import fcntl

    with store.partial_path(ref).open("ab") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True


async def test_bytes_that_are_not_the_bundle_are_discarded_and_a_second_writer_waits(
    peer_bundles: BundleStore,
) -> None:
    honest = b"the honest bundle"
    ref = ref_of(honest)
    path = f"/bundles/{ref.digest}"
    with peer_bundles.upload(ref, 0, 1):  # another request is writing it right now
        response = await call("PUT", path, marin_token(), params={"size": ref.size, "offset": 0}, content=honest)
        assert "being uploaded by another request" in refusal(response, 503, "unavailable")
    forged = b"a forged bundle!!"
    assert len(forged) == len(honest)
    response = await call("PUT", path, marin_token(), params={"size": ref.size, "offset": 0}, content=forged)
    says = refusal(response, 503, "unavailable")
    assert f"hash to sha256:{hashlib.sha256(forged).hexdigest()}; the upload was discarded" in says
    assert peer_bundles.received(ref) == 0 and not peer_bundles.has(ref)
    response = await call("PUT", path, marin_token(), params={"size": ref.size, "offset": 5}, content=honest[5:])
    assert "does not continue the upload, which holds 0 bytes: send from 0" in refusal(response, 503, "unavailable")


# The handoff: the job reads its workdir; a backend that cannot take it refuses ----------------------


def test_the_job_runs_in_its_unpacked_bundle_and_reads_it(
    url: str, peer: Peer, parent_bundles: BundleStore, peer_bundles: BundleStore, workdir: Path
) -> None:
    ref = bundle_workdir(workdir, parent_bundles)
    delivered = handoff(command="./read.sh", bundle=ref.model_dump())
    with pytest.raises(PeerError) as caught:  # the receiver admits no job whose bundle it lacks
        peer.receiver.handoff("marin", _request(delivered))
    assert caught.value.code is PeerErrorCode.FAILED_PRECONDITION and "is not here yet (0 of" in caught.value.message
    counting = Counting()
    transport = marin(url, parent_bundles, counting)
    transport.deliver(delivered)  # offered, told to upload, uploads, offered again
    methods = [method for method, _ in counting.calls]
    assert methods[:2] == ["POST", "GET"] and methods[-1] == "POST" and set(methods[2:-1]) == {"PUT"}
    assert peer.wait_until_finished().state is JobState.SUCCEEDED
    lines = transport.logs("/alice/train", "", 100).lines
    assert lines == (f"[replica 0] {hashlib.sha256((workdir / 'data.bin').read_bytes()).hexdigest()}",)


def test_a_peer_whose_backends_take_no_bundle_refuses_the_handoff_to_be_requeued(
    url: str, peer: Peer, parent_bundles: BundleStore, peer_bundles: BundleStore, workdir: Path
) -> None:
    peer.federation.backends["default"].bundles = None  # type: ignore[attr-defined]  # like Kubernetes today
    ref = bundle_workdir(workdir, parent_bundles)
    with pytest.raises(PeerError) as caught:
        marin(url, parent_bundles).deliver(handoff(command="./read.sh", bundle=ref.model_dump()))
    error = caught.value
    assert error.code is PeerErrorCode.RESOURCE_EXHAUSTED
    assert error.message == (
        f"no backend of cluster cw-east can receive job /alice/train's workdir bundle of {ref.size} bytes "
        "(bundles taken: default at most 0 bytes)"
    )
    assert error_kind(error) is DeliveryError.CANNOT_TAKE  # requeued elsewhere, not killed
    assert peer.store.list_jobs(limit=10) == []
    assert peer_bundles.received(ref) == 0  # refused before any byte of the bundle was sent


def _request(delivered):  # type: ignore[no-untyped-def]
    from iris_airflow_provider.peers.wire import HandoffRequest

    return HandoffRequest.of(delivered)


async def test_a_new_upload_the_store_has_no_room_for_is_resource_exhausted_before_any_byte(
    peer: Peer, peer_bundles: BundleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundles = BundleSettings(max_bundle_bytes=2 * MiB, max_total_bytes=3 * MiB)
    monkeypatch.setattr(peer.federation, "config", peer.federation.config.model_copy(update={"bundles": bundles}))
    held = os.urandom(2 * MiB)  # a bundle used a moment ago: a job may just have been admitted on it
    held_ref = ref_of(held)
    for offset in range(0, len(held), CHUNK):
        with peer_bundles.upload(held_ref, offset, CHUNK) as chunk:
            chunk.write(held[offset : offset + CHUNK])
    peer_bundles.complete(held_ref)

    incoming = BundleRef(digest="sha256:" + "3" * 64, size=2 * MiB)
    path, params = f"/bundles/{incoming.digest}", {"size": incoming.size, "offset": 0}
    says = refusal(await call("GET", path, marin_token(), params=params), 429, "resource_exhausted")
    assert f"bundle {incoming.digest} of {2 * MiB} bytes does not fit" in says
    assert "bundles.max_total_bytes" in says and f"holds {2 * MiB} bytes, of which 0 can be let go" in says
    body = Body(CHUNK)
    response = await call(
        "PUT", path, marin_token(), params=params, content=body, headers={"Content-Length": str(CHUNK)}
    )
    assert "bundles.max_total_bytes" in refusal(response, 429, "resource_exhausted")
    assert body.pulled == 0 and peer_bundles.received(incoming) == 0

    small = BundleRef(digest="sha256:" + "4" * 64, size=1 * MiB)  # fits beside it
    response = await call("GET", f"/bundles/{small.digest}", marin_token(), params={"size": small.size})
    assert response.status_code == 200 and response.json()["received"] == 0

    # Once the held bundle is past the grace and no live job refers to it, it can be let go: admitted.
    long_ago = time.time() - 600
    os.utime(peer_bundles.path(held_ref), (long_ago, long_ago))
    response = await call("GET", path, marin_token(), params=params)
    assert response.status_code == 200 and response.json()["received"] == 0


async def test_a_bundle_status_admits_the_upload_and_promises_its_room_before_any_byte(
    peer: Peer, peer_bundles: BundleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundles = BundleSettings(max_bundle_bytes=2 * MiB, max_total_bytes=3 * MiB)
    monkeypatch.setattr(peer.federation, "config", peer.federation.config.model_copy(update={"bundles": bundles}))
    first, second = (BundleRef(digest="sha256:" + c * 64, size=2 * MiB) for c in "56")
    response = await call("GET", f"/bundles/{first.digest}", marin_token(), params={"size": first.size})
    assert response.status_code == 200 and response.json()["received"] == 0
    assert peer_bundles.is_uploading(first)  # admitted: its 2 MiB are promised, though none is here

    says = refusal(
        await call("GET", f"/bundles/{second.digest}", marin_token(), params={"size": second.size}),
        429,
        "resource_exhausted",
    )
    assert f"uploads in progress have {2 * MiB} bytes still to come" in says
    assert not peer_bundles.is_uploading(second)

    # The admitted one goes on (asked again, or its first chunk): it is not judged, nor promised, twice.
    response = await call("GET", f"/bundles/{first.digest}", marin_token(), params={"size": first.size})
    assert response.status_code == 200
    path, params = f"/bundles/{first.digest}", {"size": first.size, "offset": 0}
    chunk = await call("PUT", path, marin_token(), params=params, content=b"x" * CHUNK)
    assert chunk.status_code == 200 and chunk.json()["received"] == CHUNK

"""The Airflow peer transport over real HTTP against the peer API (served by uvicorn on loopback,
verifying real tokens, backed by a real receiving cluster): every call and how each kind of answer
is classified for the caller's retry policy."""

from __future__ import annotations

import socket
import time

import pytest
from fastapi import FastAPI, Response

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import TokenMinter, generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.peer_api import app
from tests.peers.conftest import MARIN_PRIVATE, OTHER_PRIVATE, free_port
from tests.receiving_peer import Peer


@pytest.fixture
def url(peer: Peer, serve) -> str:  # type: ignore[no-untyped-def]
    api_server = FastAPI()
    api_server.mount(API_PREFIX, app)  # where the plugin mounts it in the api-server
    return str(serve(api_server))


def marin(url: str, **kwargs: float) -> AirflowPeer:
    return AirflowPeer("cw-east", url, TokenMinter("marin", MARIN_PRIVATE), allow_insecure_http=True, **kwargs)


def handoff(
    job_id: str = "/alice/train", nonce: str = "n1", *, user: str = "alice@example.com", **spec: object
) -> Handoff:
    body = {
        "command": "echo trained on the peer",
        "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}},
    }
    return Handoff(
        job_id=job_id,
        nonce=nonce,
        spec=parse_job({"job_id": job_id, **body, **spec}),
        backend_id="default",
        requester="marin",
        owner_principal=user,
        submitting_user=user,
        submitted_at_ms=1,
    )


def refused(call: object, code: PeerErrorCode) -> str:
    with pytest.raises(PeerError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code is code, caught.value
    return caught.value.message


def test_the_heartbeat_carries_each_backend_with_its_availability(url: str) -> None:
    (backend,) = marin(url).heartbeat()
    assert backend.backend_id == "default"
    assert backend.availability is not None and backend.availability.amounts["h100"] == 8


def test_a_job_is_delivered_replayed_synced_and_its_output_read(url: str, peer: Peer) -> None:
    transport = marin(url)
    first = transport.deliver(handoff())
    assert first.nonce == "n1" and first.state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED)
    assert transport.deliver(handoff()).nonce == "n1"  # a replay: same job, nothing new
    assert peer.runs == [("marin:/alice/train", "n1")]
    peer.wait_until_finished()
    result = transport.sync(["/alice/train"], "")
    report = result.reports["/alice/train"]
    assert (report.state, report.exit_code) == (JobState.SUCCEEDED, 0)
    assert [(r.index, r.state, r.exit_code) for r in report.replicas] == [(0, JobState.SUCCEEDED, 0)]
    assert transport.sync(["/alice/train"], result.cursor).cursor == result.cursor
    chunk = transport.logs("/alice/train", "", 100)
    assert any("trained on the peer" in line for line in chunk.lines)
    assert transport.logs("/alice/train", chunk.next_cursor, 100).lines == ()


def test_a_full_snapshot_reports_jobs_the_peer_no_longer_has_as_gone(url: str) -> None:
    result = marin(url).sync(["/alice/vanished"], "")
    assert result.gone == frozenset({"/alice/vanished"}) and result.reports == {}


def test_cancel_stops_a_running_job_and_a_job_never_handed_off_is_not_found(url: str, peer: Peer) -> None:
    transport = marin(url)
    transport.deliver(handoff(command="sleep 30"))
    assert transport.cancel("/alice/train", "another-incarnation") is False
    assert not peer.store.get_job("marin:/alice/train").cancel_requested
    assert transport.cancel("/alice/train", "n1") is True
    assert peer.wait_until_finished().state is JobState.KILLED
    assert transport.cancel("/alice/never") is False


@pytest.mark.parametrize(
    ("delivered", "code", "says"),
    [
        (handoff(user="mallory@evil.org"), PeerErrorCode.PERMISSION_DENIED, "'mallory@evil.org' is not admitted"),
        (handoff(user="local_admin"), PeerErrorCode.PERMISSION_DENIED, "accountable submitter"),
        (handoff("/alice/train/child"), PeerErrorCode.INVALID_ARGUMENT, "must be a root job"),
    ],
)
def test_terminal_refusals_keep_their_code_and_message(
    url: str, peer: Peer, delivered: Handoff, code: PeerErrorCode, says: str
) -> None:
    assert says in refused(lambda: marin(url).deliver(delivered), code)
    assert peer.store.list_jobs(limit=10) == []


def test_a_peer_too_small_for_the_job_answers_resource_exhausted_which_requeues(url: str) -> None:
    too_big = handoff(resources={"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 2})
    with pytest.raises(PeerError) as caught:
        marin(url).deliver(too_big)
    assert caught.value.code is PeerErrorCode.RESOURCE_EXHAUSTED
    assert caught.value.requeues and not caught.value.terminal


def test_another_incarnation_still_running_is_already_exists(url: str) -> None:
    transport = marin(url)
    transport.deliver(handoff(command="sleep 30"))
    says = refused(lambda: transport.deliver(handoff(nonce="n2")), PeerErrorCode.ALREADY_EXISTS)
    assert "earlier incarnation" in says


def test_a_peer_may_not_touch_jobs_another_peer_handed_off(url: str, peer: Peer) -> None:
    marin(url).deliver(handoff())
    west = AirflowPeer("cw-east", url, TokenMinter("cw-west", OTHER_PRIVATE), allow_insecure_http=True)
    assert "/alice/train" not in west.sync(["/alice/train"], "").reports
    assert west.cancel("/alice/train") is False
    assert not peer.store.get_job("marin:/alice/train").cancel_requested
    refused(lambda: west.logs("/alice/train", "", 10), PeerErrorCode.NOT_FOUND)


def test_a_cluster_the_peer_does_not_trust_is_unauthenticated_which_is_retried(url: str) -> None:
    stranger = AirflowPeer("cw-east", url, TokenMinter("marin", generate_keypair()[0]), allow_insecure_http=True)
    says = refused(stranger.heartbeat, PeerErrorCode.UNAUTHENTICATED)
    assert "is not one of its trusted keys here" in says


def test_a_peer_that_is_down_or_hangs_is_unavailable_within_the_timeout(serve) -> None:  # type: ignore[no-untyped-def]
    down = marin(f"http://127.0.0.1:{free_port()}")
    assert "unreachable" in refused(down.heartbeat, PeerErrorCode.UNAVAILABLE)
    with socket.socket() as silent:  # accepts connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hanging = marin(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_seconds=0.5)
        started = time.monotonic()
        assert "timed out" in refused(hanging.heartbeat, PeerErrorCode.UNAVAILABLE)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (502, PeerErrorCode.UNAVAILABLE),
        (500, PeerErrorCode.UNAVAILABLE),
        (403, PeerErrorCode.PERMISSION_DENIED),
        (409, PeerErrorCode.ALREADY_EXISTS),
        (404, PeerErrorCode.NOT_FOUND),
    ],
)
def test_answers_without_an_error_body_are_classified_by_status(serve, status: int, code: PeerErrorCode) -> None:  # type: ignore[no-untyped-def]
    proxy = FastAPI()

    @proxy.api_route("/{path:path}", methods=["GET", "POST"])
    def gateway(path: str) -> Response:  # a load balancer or proxy in front of the api-server
        return Response(f"<html>gateway says {status}</html>", status_code=status, media_type="text/html")

    says = refused(marin(serve(proxy)).heartbeat, code)
    assert f"answered {status}" in says and "gateway says" in says

"""The serving proxy over real HTTP: the plugin's FastAPI app under uvicorn, a real process backend
running the standard-library server of ``served_app.py`` as a job, and a real :class:`Serving`.

One server plays both clusters: requests tagged ``cluster=cw-east`` take the parent's relay, which
forwards to the same server's capability route as it would to a peer (the Airflow wiring itself is
covered end to end in ``tests/e2e/test_serving.py``)."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware

import devtools
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.process import processes
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.serving import PROXY_PREFIX
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.plugins import serving_proxy
from iris_airflow_provider.services.serving import Serving
from tests.waiting import wait_for, wait_state

SERVED_APP = (Path(devtools.__file__).parent / "served_app.py").read_text()
CLUSTER = "cw-east"
SECRET = b"k" * 32
TOKENS = ["Hello", " from", " the", " peer", "!"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Stage:
    url: str  # the proxy's origin (the parent and the child alike)
    backend: ProcessBackend
    serving: Serving
    gates: Path
    job_id: str = "/alice/llm"

    def minted(self, port: str = "http", *, nonce: str = "n1", serving: Serving | None = None) -> str:
        return (serving or self.serving).urls_for(self.job_id, nonce, "cpu", [port])[port]

    def served_requests(self) -> list[str]:
        return [line for line in self.backend.logs(self.job_id).lines if "served:" in line]


def start_job(backend: ProcessBackend, gates: Path, nonce: str) -> None:
    spec = parse_job(
        {
            "job_id": "/alice/llm",
            "command": [sys.executable, "served_app.py"],
            "files": {"served_app.py": SERVED_APP},
            "env": {"SERVING_GATE_DIR": str(gates)},
            "ports": [{"name": "http"}],
        }
    )
    backend.submit(Submission(spec.job_id, nonce, spec, "", 1_000))

    def listening() -> bool:
        served = backend.served_port(spec.job_id, "http")
        if served is None or served.nonce != nonce:
            return False
        try:
            with socket.create_connection((served.host, served.port), timeout=1):
                return True
        except OSError:
            return False

    wait_for(listening, "the served app to listen on its port", timeout=30)


@pytest.fixture
def stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stage]:
    backend = ProcessBackend("cpu", tmp_path / "backend")
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    serving = Serving(
        cluster=CLUSTER, secret=SECRET, own_url=origin, public_parent=origin, backends={"cpu": backend}, ttl_seconds=600
    )
    monkeypatch.setattr(serving_proxy, "open_port", lambda token, name: serving.open(token, name))
    targets = {CLUSTER: origin}
    monkeypatch.setattr(
        serving_proxy,
        "relay_target",
        lambda tagged: (lambda c, _, r: (c, targets[c], r) if c in targets else None)(
            *tagged[len("cluster=") :].partition("/")
        ),
    )
    monkeypatch.setattr(serving_proxy, "_client", None)
    root = FastAPI()
    root.mount(PROXY_PREFIX, serving_proxy.app)  # as the api-server mounts the plugin's app ...
    root.add_middleware(GZipMiddleware, minimum_size=1024, compresslevel=5)  # ... under Airflow's own GZip
    server = uvicorn.Server(uvicorn.Config(root, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the proxy to start")
    gates = tmp_path / "gates"
    gates.mkdir()
    start_job(backend, gates, "n1")
    try:
        yield Stage(origin, backend, serving, gates)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for status in (tmp_path / "backend" / "jobs").glob("*/status.json"):
            data = json.loads(status.read_text())
            if data["state"] in ("starting", "running") and data.get("pid"):
                processes.kill_session(data["pid"])


def test_the_minted_url_is_the_parents_relay(stage: Stage) -> None:
    url = stage.minted()
    assert url.startswith(f"{stage.url}/proxy/t/cluster={CLUSTER}/") and url.endswith("/http/")


def test_an_openai_stream_arrives_token_by_token_through_the_relay(stage: Stage) -> None:
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}], "gate": "stream-1"}
    seen: list[str] = []
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", stage.minted() + "v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
                break
        # The server is still holding every later token behind the gate: the first one streamed alone.
        assert seen == ["Hello"] and not (stage.gates / "stream-1").exists()
        (stage.gates / "stream-1").touch()
        for line in lines:
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
    assert seen == TOKENS


def test_a_chunked_stream_arrives_line_by_line_despite_the_api_servers_compression(stage: Stage) -> None:
    seen: list[str] = []
    with (
        httpx.Client(timeout=60, headers={"Accept-Encoding": "gzip"}) as client,
        client.stream("POST", stage.minted() + "ndjson", json={"gate": "lines-1"}) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        seen.append(json.loads(next(lines))["token"])
        assert seen == ["Hello"] and not (stage.gates / "lines-1").exists()
        (stage.gates / "lines-1").touch()
        seen += [json.loads(line)["token"] for line in lines if line]
    assert seen == TOKENS


@pytest.mark.parametrize("relayed", [True, False], ids=["through-the-relay", "directly"])
def test_a_caller_going_away_mid_stream_closes_the_stream_to_the_app(stage: Stage, relayed: bool) -> None:
    """A model streaming to nobody would go on spending its accelerator: when the caller hangs up,
    the proxy (each hop of it) hangs up on the app too."""
    url = stage.minted() if relayed else stage.serving.urls_for(stage.job_id, "n1", "cpu", ["http"])["http"]
    if not relayed:
        url = url.replace(f"/proxy/t/cluster={CLUSTER}/", "/proxy/t/")
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "endless", json={}) as response:
        assert response.status_code == 200
        assert json.loads(next(response.iter_lines())) == {"line": 0}
    wait_for(
        lambda: any("/endless: the caller went away" in line for line in stage.backend.logs(stage.job_id).lines),
        "the app to see its caller go away",
        timeout=30,
    )


def test_a_large_request_body_streams_to_the_app_intact(stage: Stage) -> None:
    piece = bytes(range(256)) * 4096  # 1 MiB
    pieces = 24
    digest = hashlib.sha256(piece * pieces).hexdigest()

    def body() -> Iterator[bytes]:
        for _ in range(pieces):
            yield piece

    headers = {"Content-Length": str(len(piece) * pieces)}
    answer = httpx.post(stage.minted() + "echo", content=body(), headers=headers, timeout=120)
    assert answer.status_code == 200
    assert answer.json() == {"bytes": len(piece) * pieces, "sha256": digest}


def test_a_root_relative_redirect_round_trips_through_the_relay_and_directly(stage: Stage) -> None:
    relayed = stage.minted()
    answer = httpx.get(relayed + "redirect")
    assert answer.status_code == 302
    prefix = relayed.removeprefix(stage.url).removesuffix("/")
    assert answer.headers["location"] == f"{prefix}/landed"
    assert httpx.get(stage.url + answer.headers["location"]).text == "landed"
    # A caller's own relay header does not survive the relay: the tag is the relay's.
    spoofed = httpx.get(relayed + "redirect", headers={"X-Iris-Relay-Cluster": "cw-evil"})
    assert spoofed.headers["location"] == f"{prefix}/landed"
    # Directly on the child: its own capability prefix, without the cluster tag.
    direct = relayed.replace(f"/cluster={CLUSTER}", "")
    answer = httpx.get(direct + "redirect")
    assert answer.headers["location"] == direct.removeprefix(stage.url) + "landed"
    assert httpx.get(direct + "redirect", follow_redirects=True).text == "landed"


def test_the_path_and_query_reach_the_app_as_the_caller_encoded_them(stage: Stage) -> None:
    answer = httpx.get(stage.minted() + "a%2Fb%2525c/d?q=%26x")
    assert answer.json()["path"] == "/a%2Fb%2525c/d?q=%26x"


def test_airflows_session_cookie_is_not_handed_to_the_app(stage: Stage) -> None:
    answer = httpx.get(stage.minted() + "whoami", headers={"Cookie": "_token=airflow-jwt; app=1"})
    assert answer.json() == {"path": "/whoami", "cookie": "app=1"}


def test_refused_tokens_get_401_or_403_and_nothing_is_served(stage: Stage) -> None:
    before = len(stage.served_requests())
    good = stage.minted()
    token = good.split("/proxy/t/cluster=cw-east/")[1].split("/")[0]
    relay = f"{stage.url}/proxy/t/cluster={CLUSTER}"
    past = Serving(
        cluster=CLUSTER,
        secret=SECRET,
        own_url=stage.url,
        public_parent="",
        backends=stage.serving.backends,
        ttl_seconds=60,
        clock=lambda: time.time() - 120,
    )
    foreign = Serving(
        cluster="cw-west", secret=b"w" * 32, own_url=stage.url, public_parent="", backends=stage.serving.backends
    )
    forged = Serving(
        cluster=CLUSTER, secret=b"f" * 32, own_url=stage.url, public_parent="", backends=stage.serving.backends
    )
    cases = {
        "expired": (stage.minted(serving=past) + "probe", 401),
        "forged": (stage.minted(serving=forged) + "probe", 401),
        "tampered": (f"{relay}/{token[:-4]}AAAA/http/probe", 401),
        "foreign": (stage.minted(serving=foreign) + "probe", 403),
        "wrong port": (f"{relay}/{token}/admin/probe", 403),
        "another incarnation": (stage.minted(nonce="n0") + "probe", 403),
        "unknown cluster": (f"{stage.url}/proxy/t/cluster=cw-nowhere/{token}/http/probe", 404),
    }
    for case, (url, status) in cases.items():
        answer = httpx.get(url)
        assert answer.status_code == status, case
        assert answer.json()["message"], case
    assert httpx.get(good + "served").status_code == 200
    requests = stage.served_requests()[before:]
    assert len(requests) == 1 and "/served" in requests[0]


def test_a_token_opens_only_its_own_incarnation(stage: Stage) -> None:
    first = stage.minted(nonce="n1")
    assert stage.backend.cancel(stage.job_id)
    wait_state(stage.backend, stage.job_id, JobState.KILLED, timeout=30)
    assert httpx.get(first + "probe").status_code == 503  # nothing serves it now
    start_job(stage.backend, stage.gates, "n2")
    assert httpx.get(first + "probe").status_code == 403
    assert httpx.get(stage.minted(nonce="n2") + "probe").status_code == 200


def test_a_websocket_echoes_through_the_relay_and_an_out_of_scope_token_is_refused_before_the_upgrade(
    stage: Stage,
) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    socket_url = stage.minted().replace("http://", "ws://", 1) + "ws"
    with connect(socket_url, open_timeout=30) as websocket:
        websocket.send("hello through two hops")
        assert websocket.recv(timeout=30) == "hello through two hops"
        websocket.send(b"\x00\x01binary")
        assert websocket.recv(timeout=30) == b"\x00\x01binary"
    token = stage.minted().split(f"cluster={CLUSTER}/")[1].split("/")[0]
    with pytest.raises(InvalidStatus) as denied:
        connect(f"{stage.url.replace('http', 'ws', 1)}/proxy/t/cluster={CLUSTER}/{token}/admin/ws", open_timeout=30)
    assert denied.value.response.status_code == 403


def test_the_served_app_ends_its_job_when_told_through_its_url(stage: Stage) -> None:
    assert httpx.post(stage.minted() + "shutdown", timeout=30).text == "shutting down"
    report = wait_state(stage.backend, stage.job_id, JobState.SUCCEEDED, timeout=30)
    assert report.exit_code == 0
    assert httpx.get(stage.minted() + "probe").status_code == 503

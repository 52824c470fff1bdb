"""A job's serving endpoint on a peer, reached through the parent: two real Airflow deployments.

The parent ``marin`` pins a job to its Airflow peer ``cw-east``; the job is the standard-library
OpenAI-style server of ``devtools/served_app.py`` on its named port ``http``. ``cw-east`` has
``federation.public_parent`` set to marin's api-server, so the URL it mints (its runner task's log
and XCom) is marin's relay, ``/proxy/t/cluster=cw-east/<token>/http/``; marin forwards it blindly
(it has no serving secret at all), and cw-east checks the token and serves. marin's own task logs
and pushes the URL cw-east reported for it, and marin's Federation page shows it.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from playwright.sync_api import expect

import devtools
from devtools.airflow_deployment import AirflowDeployment
from devtools.browser import page_url, sign_in
from iris_airflow_provider.core.serving import ServingScope, mint_token
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID, runner_run_id
from iris_airflow_provider.peers.identity import generate_keypair
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import ARTIFACTS, free_port
from tests.e2e.deployments import deployment_pair
from tests.e2e.jobs import admitted_job_of
from tests.waiting import wait_for

_wait = partial(wait_for, timeout=180, interval=0.5)

pytestmark = pytest.mark.e2e

SERVED_APP = (Path(devtools.__file__).parent / "served_app.py").read_text()
PEER_SECRET = "cw-east-serving-secret-of-at-least-32-bytes"
TOKENS = ["Hello", " from", " the", " peer", "!"]


@dataclass
class Serving:
    parent: AirflowDeployment
    peer: AirflowDeployment
    peer_store: FederationStore
    url: str  # the URL cw-east minted: marin's relay
    gates: Path
    job_key: str  # where cw-east keeps the job
    run: str  # marin's run of e2e_job that submitted it
    job_id: str  # the job on marin


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    root = tmp_path_factory.mktemp("serving")
    gates = root / "gates"
    gates.mkdir()
    private, public = generate_keypair()
    (root / "marin.key").write_text(private)
    (root / "marin.pub").write_text(public)
    peer_port, parent_port = free_port(), free_port()
    (root / "parent.yaml").write_text(
        f"""
name: marin
placement: {{sync_interval_seconds: 2}}
federation: {{private_key: {root / "marin.key"}}}
backends: [{{id: cpu, kind: process}}]
peers: [{{id: cw-east, kind: airflow, url: "http://127.0.0.1:{peer_port}", allow_insecure_http: true}}]
"""
    )
    (root / "peer.yaml").write_text(
        f"""
name: cw-east
placement: {{sync_interval_seconds: 2}}
federation:
  trusted_peers: {{marin: {{public_key: {root / "marin.pub"}}}}}
  allowed_submitters: ["alice"]
  public_parent: "http://127.0.0.1:{parent_port}"
serving: {{token_secret: {PEER_SECRET}, token_ttl_seconds: 3600}}
backends: [{{id: default, kind: process}}]
"""
    )
    with deployment_pair(
        root, databases="iris_serving", logs="serving", peer_port=peer_port, parent_port=parent_port
    ) as running:
        parent, peer = running.parent, running.peer
        job = {
            "command": [sys.executable, "served_app.py"],
            "files": {"served_app.py": SERVED_APP},
            "env": {"SERVING_GATE_DIR": str(gates), "SERVING_LIFETIME_S": "900"},
            "ports": [{"name": "http"}],
            "target_cluster": "cw-east",
        }
        run = parent.trigger("e2e_job", {"job": job}, user="alice")
        job_id = admitted_job_of(parent, run)

        def minted() -> str | None:
            received = running.peer_store.get_job(f"marin:{job_id}")
            if received is None:
                return None
            try:
                urls = peer.xcom(
                    RUNNER_DAG_ID, runner_run_id(received.job_id, received.nonce), "run", key="serving_urls"
                )
            except httpx.HTTPStatusError:
                return None
            return str(urls["http"])

        url = _wait(minted, "the serving URL cw-east minted for the job")

        def answers() -> bool:
            return httpx.get(url + "ready", timeout=30).status_code == 200

        _wait(answers, "the served app to answer through marin")
        try:
            yield Serving(parent, peer, running.peer_store, url, gates, f"marin:{job_id}", run, job_id)
        finally:  # failing the run cancels the job, which stops it on the peer
            parent.set_run_state("e2e_job", run, "failed")
            _wait(lambda: running.peer_store.get_job(f"marin:{job_id}").terminal, "the served job to stop on the peer")


def test_the_peer_mints_the_parents_relay_url_and_logs_it(serving: Serving) -> None:
    assert serving.url.startswith(f"{serving.parent.base_url}/proxy/t/cluster=cw-east/")
    assert serving.url.endswith("/http/")
    runs = serving.peer.api("GET", f"/api/v2/dags/{RUNNER_DAG_ID}/dagRuns").json()["dag_runs"]
    log = serving.peer.task_log(RUNNER_DAG_ID, runs[0]["dag_run_id"], "run")
    # Airflow's log redaction masks the token, a JWT, as it does every JWT; XCom holds the URL whole.
    relay = serving.url.split("/cluster=cw-east/")[0] + "/cluster=cw-east/"
    assert "Serving port http of job marin:/alice/e2e_job" in log and f"at {relay}eyJ***" in log
    assert serving.url.split("/cluster=cw-east/")[1].split("/")[0] not in log


def test_an_openai_stream_on_the_peer_arrives_token_by_token_through_the_parent(serving: Serving) -> None:
    assert stream(serving.url, serving.gates, "e2e-stream") == TOKENS


def stream(url: str, gates: Path, gate: str) -> list[str]:
    """The tokens of a streamed completion at ``url``; the first must arrive while the served app
    still holds the rest behind ``gate``."""
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}], "gate": gate}
    seen: list[str] = []
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", url + "v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
                break
        # Two hops, and the served app still holds the later tokens behind its gate.
        assert seen == ["Hello"] and not (gates / gate).exists()
        (gates / gate).touch()
        for line in lines:
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
    return seen


def test_the_parents_task_logs_and_pushes_the_url_the_peer_minted_and_its_page_shows_it(serving: Serving) -> None:
    """marin mints nothing: its task announces the relayed URL cw-east reported (once marin checked
    it is marin's own relay for cw-east), once, and the job's page on marin shows it."""
    parent = serving.parent

    def pushed() -> dict[str, str] | None:
        try:
            return dict(parent.xcom("e2e_job", serving.run, "run", key="serving_urls"))
        except httpx.HTTPStatusError:
            return None

    urls = _wait(pushed, "the serving URLs in marin's task XCom")
    relay = f"{parent.base_url}/proxy/t/cluster=cw-east/"
    assert list(urls) == ["http"] and urls["http"].startswith(relay + "eyJ") and urls["http"].endswith("/http/")
    line = f"Serving port http of job {serving.job_id} at {relay}eyJ***"

    def logged() -> str | None:
        log = parent.task_log("e2e_job", serving.run, "run")
        return log if line in log else None

    log = _wait(logged, line)
    assert log.count("Serving port http of job") == 1, log
    # Woken to announce it, the task waited on: it neither submitted again nor reattached.
    assert log.count(f"Submitted job {serving.job_id}") == 1 and "Reattached to job" not in log, log
    describe = parent.api("GET", "/iris/federation/ui/api/jobs/describe", params={"job_id": serving.job_id})
    assert describe.json()["serving_urls"] == urls
    assert stream(urls["http"], serving.gates, "e2e-parent-stream") == TOKENS


def test_a_root_relative_redirect_round_trips_through_the_parent(serving: Serving) -> None:
    answer = httpx.get(serving.url + "redirect", timeout=60)
    assert answer.status_code == 302
    assert answer.headers["location"] == serving.url.removeprefix(serving.parent.base_url) + "landed"
    assert httpx.get(serving.url + "redirect", follow_redirects=True, timeout=60).text == "landed"


def test_the_token_is_checked_by_the_peer_alone(serving: Serving) -> None:
    token = serving.url.split("/cluster=cw-east/")[1].split("/")[0]
    claims = jwt.decode(token, options={"verify_signature": False})
    scope = ServingScope("cw-east", claims["job"], claims["inc"], claims["be"], claims["port"])
    relay = f"{serving.parent.base_url}/proxy/t/cluster=cw-east"
    expired = mint_token(PEER_SECRET.encode(), scope, now_s=int(time.time()) - 7200, ttl_s=3600)
    foreign = mint_token(b"m" * 32, replace(scope, cluster="marin"), now_s=int(time.time()), ttl_s=60)
    forged = mint_token(b"f" * 32, scope, now_s=int(time.time()), ttl_s=60)
    cases = {
        "expired": (f"{relay}/{expired}/http/ready", 401),
        "forged": (f"{relay}/{forged}/http/ready", 401),
        "foreign": (f"{relay}/{foreign}/http/ready", 403),
        "another port": (f"{relay}/{token}/admin/ready", 403),
        "unknown cluster": (f"{serving.parent.base_url}/proxy/t/cluster=cw-west/{token}/http/ready", 404),
    }
    for case, (url, status) in cases.items():
        answer = httpx.get(url, timeout=60)
        assert answer.status_code == status, f"{case}: {answer.status_code} {answer.text[:200]}"
    # The same token opens the port directly on the peer, and only there: marin mints and checks nothing.
    direct = f"{serving.peer.base_url}/proxy/t/{token}/http/ready"
    assert httpx.get(direct, timeout=60).status_code == 200
    assert httpx.get(f"{serving.parent.base_url}/proxy/t/{token}/http/ready", timeout=60).status_code == 403


def test_a_websocket_on_the_peer_echoes_through_the_parent(serving: Serving) -> None:
    from websockets.sync.client import connect

    with connect(serving.url.replace("http://", "ws://", 1) + "ws", open_timeout=60) as websocket:
        websocket.send("hello through marin")
        assert websocket.recv(timeout=60) == "hello through marin"


def test_the_peers_federation_page_and_its_api_show_a_working_url(serving: Serving, browser: Any) -> None:
    describe = serving.peer.api("GET", "/iris/federation/ui/api/jobs/describe", params={"job_id": serving.job_key})
    relay = serving.url.split("/cluster=cw-east/")[0] + "/cluster=cw-east/"
    url = describe.json()["serving_urls"]["http"]
    assert url.startswith(relay) and url.endswith("/http/")
    assert httpx.get(url + "ready", timeout=60).status_code == 200

    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, serving.peer.base_url, "admin", serving.peer.password("admin"))
    page.goto(page_url(serving.peer.base_url, serving.job_key))
    link = page.get_by_test_id("job-detail").get_by_test_id("serving-url")
    # The page loads its data after it renders: as patient as its own default timeout.
    expect(link).to_have_attribute("href", re.compile("^" + re.escape(relay) + r"[\w.-]+/http/$"), timeout=30_000)
    expect(link).to_contain_text("http: " + relay, timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "job-detail-serving.png"))
    assert httpx.get(str(link.get_attribute("href")) + "ready", timeout=60).status_code == 200
    assert errors == []


def test_a_job_running_on_the_parent_is_served_directly_under_a_secret_derived_from_its_key(serving: Serving) -> None:
    """marin sets no serving secret: its federation key signs (a derived secret), and with no public
    parent of its own its URL is its own api-server's."""
    parent = serving.parent
    job = {
        "command": [sys.executable, "served_app.py"],
        "files": {"served_app.py": SERVED_APP},
        "env": {"SERVING_LIFETIME_S": "600"},
        "ports": [{"name": "http"}],
    }
    run = parent.trigger("e2e_job", {"job": job}, user="alice")
    admitted_job_of(parent, run)

    def minted() -> str | None:
        try:
            return str(parent.xcom("e2e_job", run, "run", key="serving_urls")["http"])
        except httpx.HTTPStatusError:
            return None

    url = _wait(minted, "the serving URL marin minted for its own job")
    assert url.startswith(f"{parent.base_url}/proxy/t/eyJ") and "cluster=" not in url
    _wait(lambda: httpx.get(url + "ready", timeout=30).status_code == 200, "the job to answer on marin")
    # End the job only once its task is deferred: a trigger firing while the scheduler has yet to
    # take the deferral's executor event makes Airflow fail the task ("finished with state success,
    # but the task instance's state attribute is queued"), an Airflow race, not ours.
    parent.wait_for_task_state("e2e_job", run, "run", ("deferred",))
    assert httpx.post(url + "shutdown", timeout=30).text == "shutting down"
    assert parent.wait_for_run("e2e_job", run) == "success"
    assert httpx.get(url + "ready", timeout=30).status_code == 503  # its incarnation serves no more
    log = parent.task_log("e2e_job", run, "run")
    assert "Serving port http of job /alice/e2e_job" in log and f"at {parent.base_url}/proxy/t/eyJ***" in log

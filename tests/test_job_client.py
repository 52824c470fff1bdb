"""The job API over real HTTP (the plugin's app under uvicorn) and ``iris_airflow_provider.client``
run by a real job on the process backend with Debian's Python, which has no Airflow and no
pydantic: a coordinator submits two children, waits for them and reads their results; and the
refusals: no, forged or foreign tokens, another job's token, an over-long body, a bad field, a child
that would federate."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from iris_airflow_provider.client import ChildRejectedError, JobClient, JobClientError
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.plugins import job_api
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_tokens import JobTokens
from iris_airflow_provider.store.store import FederationStore
from tests.peers.conftest import serve
from tests.services.world import ALICE, World, spec, tick_until
from tests.store.conftest import sqlite_store
from tests.waiting import wait_for

__all__ = ["serve", "sqlite_store"]

REPO = Path(__file__).resolve().parent.parent
KEY = b"job-token-key-of-marin-for-tests!"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: no Airflow, no pydantic, no httpx

COORDINATOR = r"""
import json, os, sys
from iris_airflow_provider.client import ChildFailedError, JobClient
WRITE_RESULT = (
    "import json, os; json.dump({'shard': os.environ['SHARD'], 'project': os.environ['WANDB_PROJECT']},"
    " open(os.environ['IRIS_RESULT'], 'w'))"
)
client = JobClient.from_env()
for name in ("shard-0", "shard-1"):
    client.submit({"job_id": name, "command": [sys.executable, "-c", WRITE_RESULT], "env": {"SHARD": name}})
results = [client.wait(name, poll_seconds=0.2).result for name in ("shard-0", "shard-1")]
client.submit({"job_id": "doomed", "command": "exit 3"})
try:
    client.wait("doomed", poll_seconds=0.2)
except ChildFailedError as failed:
    results.append({"doomed": failed.child.state, "exit_code": failed.child.exit_code})
with open(os.environ["IRIS_RESULT"], "w") as out:
    json.dump({"children": results, "tree": sorted(c.job_id for c in client.children())}, out)
"""


@pytest.fixture
def cluster(tmp_path: Path, sqlite_store: FederationStore, serve) -> Iterator[tuple[World, Federation, str]]:
    world = World(tmp_path, sqlite_store)
    tokens = JobTokens("marin", KEY, federation_url="http://placeholder")
    fed = Federation(
        world.config,
        world.store,
        backends=world.backends,
        peers=world.peers,
        clock=world.clock,
        jitter=world.jitter,
        job_tokens=tokens,
    )
    assert fed.children is not None
    job_api.app.dependency_overrides[job_api.children] = lambda: fed.children
    mounted = FastAPI()
    mounted.mount(job_api.JOB_API_PREFIX, job_api.app)  # where the plugin mounts it in the api-server
    url = serve(mounted)
    tokens.federation_url = url
    yield world, fed, url
    job_api.app.dependency_overrides.clear()
    world.close()


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs Debian's python3 (no Airflow installed)")
def test_a_coordinator_submits_waits_for_and_reads_its_children_through_the_client(cluster) -> None:
    world, fed, _ = cluster
    assert subprocess.run([SYSTEM_PYTHON, "-c", "import airflow"], capture_output=True).returncode != 0
    root = spec(
        "/alice/coordinator",
        f"{SYSTEM_PYTHON} -c {shlex.quote(COORDINATOR)}",
        env={"PYTHONPATH": str(REPO), "WANDB_PROJECT": "llm"},
    )
    assert fed.submit(root, submitting_user=ALICE).job is not None
    done = tick_until(fed, world.store, "/alice/coordinator", JobState.SUCCEEDED, JobState.FAILED, timeout=60)
    logs = "\n".join(line for _, line in world.store.log_lines("/alice/coordinator"))
    assert done.state is JobState.SUCCEEDED, f"{done.error}\n{logs}"
    result = json.loads(world.store.job_result(done.job_id, done.nonce) or "null")
    assert result["children"][:2] == [
        {"shard": "shard-0", "project": "llm"},
        {"shard": "shard-1", "project": "llm"},
    ]
    assert result["children"][2] == {"doomed": "failed", "exit_code": 3}
    assert result["tree"] == [
        "/alice/coordinator/doomed",
        "/alice/coordinator/shard-0",
        "/alice/coordinator/shard-1",
    ]
    for name in ("shard-0", "shard-1"):
        child = world.job(f"/alice/coordinator/{name}")
        assert child.state is JobState.SUCCEEDED and child.submitting_user == ALICE


def _running_root(world: World, fed: Federation, name: str) -> str:
    out = world.tmp_path / f"{name}.token"
    command = f'echo "$IRIS_JOB_TOKEN" > {out}.tmp && mv {out}.tmp {out}; ' + world.held(name)
    fed.submit(spec(f"/alice/{name}", command), submitting_user=ALICE)
    return wait_for(lambda: out.exists() and out.read_text().strip(), f"{name}'s token")


def test_refusals_over_http(cluster) -> None:
    world, fed, url = cluster
    token = _running_root(world, fed, "coordinator")
    other = _running_root(world, fed, "other")
    api = f"{url}/iris/jobs/v1"

    def call(method: str, path: str, token: str | None = token, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{api}{path}", headers=headers, timeout=30, **kwargs)

    assert call("GET", "/children", token=None).status_code == 401
    assert call("GET", "/children", token="forged.token.here").json()["code"] == "UNAUTHENTICATED"
    foreign = JobTokens("cw-east", KEY, federation_url=url).mint(
        "/alice/coordinator", world.job("/alice/coordinator").nonce
    )
    assert call("GET", "/children", token=foreign).status_code == 401

    made = call("POST", "/children", json={"job_id": "a", "command": world.held("a")})
    assert made.status_code == 201, made.text
    assert made.json()["job"]["job_id"] == "/alice/coordinator/a"
    assert call("POST", "/children", json={"job_id": "a", "command": "true"}).status_code == 200  # reattached

    bad = call("POST", "/children", json={"job_id": "b", "resources": {"replicas": 0}})
    assert bad.status_code == 400 and "resources.replicas" in bad.json()["message"]
    not_json = call("POST", "/children", content=b"{not json")
    assert not_json.status_code == 400 and "body" in not_json.json()["message"]
    federating = call(
        "POST",
        "/children",
        json={"job_id": "g", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}},
    )
    assert federating.status_code == 422 and "target_cluster" in federating.json()["message"]

    # Another job's token cannot see or cancel this tree, and says nothing of what is in it.
    assert call("GET", "/job", token=other, params={"job_id": "/alice/coordinator/a"}).status_code == 403
    assert call("POST", "/cancel", token=other, params={"job_id": "/alice/coordinator/a"}).status_code == 403
    assert not world.job("/alice/coordinator/a").cancel_requested
    assert call("GET", "/job", params={"job_id": "nope"}).status_code == 404
    cancelled = call("POST", "/cancel", params={"job_id": "a"})
    assert cancelled.status_code == 200 and cancelled.json()["result"] == "cancel_requested"

    # An unauthenticated body is never read; an over-long one is refused from its length.
    assert call("POST", "/children", token=None, content=b"x" * 1000).status_code == 401
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            f"POST /iris/jobs/v1/children HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n{{}}".encode()
        )
        answer = raw.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 413"), answer
    assert "PAYLOAD_TOO_LARGE" in answer

    renewed = call("POST", "/token")
    assert renewed.status_code == 200
    assert call("GET", "/children", token=renewed.json()["token"]).status_code == 200


def test_the_client_renews_an_environment_token_past_half_its_life(cluster) -> None:
    world, fed, url = cluster
    _running_root(world, fed, "coordinator")
    nonce = world.job("/alice/coordinator").nonce
    aging = JobTokens("marin", KEY, federation_url=url, clock=lambda: time.time() - 600)
    old = aging.mint("/alice/coordinator", nonce)  # 600 s into its 900 s
    client = JobClient(url, token=old)  # no token file: as on a backend that does not rewrite one
    assert client.children() == []
    assert client.token != old
    with pytest.raises(JobClientError) as refused:
        JobClient(url, token="forged").children()
    assert refused.value.status == 401 and refused.value.code == "UNAUTHENTICATED"
    with pytest.raises(ChildRejectedError, match="target_cluster"):
        client.submit({"job_id": "g", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}})

"""A job tree between two real Airflow deployments: a coordinator pinned to peer ``cw-east`` submits
two children through ``iris_airflow_provider.client`` (run by Debian's Python, which has no
Airflow), authenticated by its job token; they run on cw-east and are mirrored back to the parent
as part of the root: states, exit codes and output per child, in the store, the task log, describe
and the Federation page. A child cw-east cannot run (gb200 devices, which it has none of) is refused
there, a job's token is worth nothing once it has ended, and a cancel of the root on the parent
kills its tree on the peer. The pair is the one ``test_peer_federation`` uses too."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import pytest

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.plugins.ui_api import UI_PREFIX
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import ARTIFACTS
from tests.e2e.jobs import admitted_job_of, job_of
from tests.e2e.shared_federation import Federation
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

_wait = partial(wait_for, timeout=180, interval=0.5)
REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
UI_API = f"{UI_PREFIX}/api"
MIRRORED: dict[str, str] = {}  # the first test's job, for the browser's look at its tree

COORDINATOR = r"""
import json, os, sys, urllib.request
from iris_airflow_provider.client import ChildRejectedError, JobClient
client = JobClient.from_env()
WRITE = (
    "import json, os; print('hello from', os.environ['SHARD']);"
    " json.dump({'shard': os.environ['SHARD']}, open(os.environ['IRIS_RESULT'], 'w'))"
)
for name in ("shard-0", "shard-1"):
    client.submit({"job_id": name, "command": [sys.executable, "-c", WRITE], "env": {"SHARD": name}})
results = [client.wait(name, poll_seconds=0.5).result for name in ("shard-0", "shard-1")]
try:
    client.submit({"job_id": "gb200", "resources": {"device": {"type": "gpu", "variant": "gb200", "count": 1}}})
    refused = ""
except ChildRejectedError as error:
    refused = error.message
token = open(os.environ["IRIS_JOB_TOKEN_FILE"]).read().strip()
with open(os.environ["IRIS_RESULT"], "w") as out:
    json.dump({"results": results, "refused": refused, "url": os.environ["IRIS_FEDERATION_URL"], "token": token}, out)
"""


@pytest.fixture(scope="module")
def pair(federation: Federation) -> Federation:
    """Parent marin and peer cw-east, shared with other modules (``tests/e2e/shared_federation.py``)."""
    return federation


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs Debian's python3 (no Airflow installed)")
def test_a_coordinator_on_the_peer_submits_two_children_that_run_there_and_are_mirrored_back(pair: Federation) -> None:
    parent, peer = pair.parent, pair.peer
    job = {
        "command": [SYSTEM_PYTHON, "-c", COORDINATOR],
        "env": {"PYTHONPATH": str(REPO)},
        "target_cluster": "cw-east",  # the whole tree runs there
    }
    run = parent.trigger("e2e_job", {"job": job}, user="alice")
    state = parent.wait_for_run("e2e_job", run)
    job_id = job_of(parent, run)
    log = parent.task_log("e2e_job", run, "run")
    assert state == "success", log
    result = parent.xcom("e2e_job", run, "run")["result"]
    assert result["results"] == [{"shard": "shard-0"}, {"shard": "shard-1"}]
    # A child the peer cannot run is refused there (it has no peers of its own: not even queued).
    assert f"Job {job_id}/gb200 is unschedulable" in result["refused"]
    assert result["url"] == peer.base_url  # the cluster the coordinator runs on

    # On the peer: the children ran there, in marin's namespace, as the root's accountable user.
    for name in ("shard-0", "shard-1"):
        child = pair.peer_store.get_job(f"marin:{job_id}/{name}")
        assert child is not None and child.state is JobState.SUCCEEDED and child.submitting_user == "alice"
    assert pair.peer_store.get_job(f"marin:{job_id}/gb200") is None
    # On the parent: mirrored as part of the root (states, exit codes), and nothing ran here.
    root = _wait(lambda: _with_children(pair.parent_store, job_id), "the children mirrored to the parent")
    assert {(c["job_id"], c["state"], c["exit_code"]) for c in root.children} == {
        (f"{job_id}/shard-0", "succeeded", 0),
        (f"{job_id}/shard-1", "succeeded", 0),
    }
    assert pair.parent_store.get_job(f"{job_id}/shard-0") is None
    # Their output and their ends reached the parent's task log, each line naming its child.
    assert f"[{job_id}/shard-0] [replica 0] hello from shard-0" in log
    assert f"[{job_id}/shard-1] [replica 0] hello from shard-1" in log
    assert f"child {job_id}/shard-1: succeeded (exit code 0)" in log

    # The coordinator's token is worth nothing once it has ended, and never to another tree.
    api = f"{peer.base_url}/iris/jobs/v1"
    ended = httpx.get(f"{api}/children", headers={"Authorization": f"Bearer {result['token']}"}, timeout=30)
    assert ended.status_code == 401 and "has ended" in ended.json()["message"]
    assert httpx.get(f"{api}/children", timeout=30).status_code == 401
    # describe on the parent (the Federation page's API, which the CLI prints) shows the tree.
    described = parent.api("GET", f"{UI_API}/jobs/describe", params={"job_id": job_id}).json()
    assert [(c["job_id"], c["state"]) for c in described["children"]] == [
        (f"{job_id}/shard-0", "succeeded"),
        (f"{job_id}/shard-1", "succeeded"),
    ]
    MIRRORED["job_id"] = job_id


def test_in_chromium_the_job_drawer_shows_the_tree(pair: Federation, browser) -> None:
    from playwright.sync_api import expect

    from devtools.browser import page_url, sign_in

    job_id = MIRRORED.get("job_id")
    if job_id is None:
        pytest.skip("needs the mirrored tree of the test before")
    page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, pair.parent.base_url, "alice", pair.parent.password("alice"))
    page.goto(page_url(pair.parent.base_url, job_id))
    children = page.get_by_test_id("job-detail").get_by_test_id("children")
    children.wait_for(timeout=90_000)  # the page loads its data after it renders, slowly on a busy machine
    expect(children).to_contain_text("shard-0")
    expect(children).to_contain_text("shard-1")
    expect(children).to_contain_text("succeeded")
    expect(children).to_contain_text("exit code 0")
    page.screenshot(path=str(ARTIFACTS / "job-tree.png"))
    assert errors == []


def _with_children(store: FederationStore, job_id: str):
    job = store.get_job(job_id)
    return (
        job
        if job is not None and len(job.children) == 2 and all(c["state"] == "succeeded" for c in job.children)
        else None
    )


def test_a_cancel_of_the_root_on_the_parent_cancels_its_tree_on_the_peer(pair: Federation) -> None:
    parent = pair.parent
    coordinator = (
        "import sys, time\n"
        "from iris_airflow_provider.client import JobClient\n"
        "client = JobClient.from_env()\n"
        "client.submit({'job_id': 'worker', 'command': 'sleep 600'})\n"
        "time.sleep(600)\n"
    )
    job = {"command": [SYSTEM_PYTHON, "-c", coordinator], "env": {"PYTHONPATH": str(REPO)}, "target_cluster": "cw-east"}
    run = parent.trigger("e2e_job", {"job": job}, user="alice")
    job_id = admitted_job_of(parent, run)
    worker = f"marin:{job_id}/worker"
    _wait(
        lambda: (w := pair.peer_store.get_job(worker)) is not None and w.state is JobState.RUNNING,
        "the worker to run on the peer",
    )
    cancelled = parent.api("POST", f"{UI_API}/jobs/cancel", params={"job_id": job_id})
    assert cancelled.status_code == 200, cancelled.text
    _wait(
        lambda: (w := pair.peer_store.get_job(worker)) is not None and w.state is JobState.KILLED,
        "the worker to be killed on the peer",
    )
    assert parent.wait_for_run("e2e_job", run) == "failed"
    assert pair.parent_store.get_job(job_id).state is JobState.KILLED

"""End to end: capacity a real deployment can trust, through the REST API and the Federation page's.

A parent ``marin`` whose agentless peer ``cw-h100`` has 4 h100, with ``reserve_after_seconds: 3``:
a big job behind a stream of small ones holds the backend and runs before them; a job no backend
could ever hold fails at once, naming the largest backend there is.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port, save_logs
from tests.e2e.jobs import admitted_job_of
from tests.postgres import scratch_database
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

_wait = partial(wait_for, timeout=120, interval=0.5)
API = "/iris/federation/ui/api"
CLUSTER = """
name: marin
placement:
  tick_interval_seconds: 30
  sync_interval_seconds: 2
  reserve_after_seconds: 3
backends:
  - {id: cpu, kind: process, max_running_jobs: 2}
peers:
  - id: cw-h100
    kind: agentless
    backends: [{id: default, kind: process, devices: {h100: 4}}]
    allowed_submitters: [alice, bob]
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    home = tmp_path_factory.mktemp("airflow-capacity")
    (home / "cluster.yaml").write_text(CLUSTER)
    with scratch_database("iris_cap_meta") as metadata_url, scratch_database("iris_cap_store") as store_url:
        deployment = AirflowDeployment(
            home=home,
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            cluster_config=home / "cluster.yaml",
            dags_folder=Path(__file__).parent / "dags",
        )
        try:
            deployment.start()
            deployment.wait_for_dag("iris_federation_tick")
            deployment.wait_for_dag("e2e_job")
            yield deployment
        finally:
            deployment.stop()
            save_logs(deployment, "capacity")


def h100(count: int, command: str) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": "h100", "count": count}}}


def held(gate: Path) -> str:
    return f"while [ ! -e {gate} ]; do sleep 0.1; done"


def ticks(store: FederationStore, count: int) -> None:
    """Wait until ``count`` more placement ticks have heartbeated the peer (ticks, not seconds)."""
    seen: set[int] = set()

    def enough() -> bool:
        record = next((p for p in store.peers() if p.peer_id == "cw-h100"), None)
        if record is not None and record.last_contact_ms is not None:
            seen.add(record.last_contact_ms)
        return len(seen) > count

    _wait(enough, f"{count} more ticks")


@pytest.fixture(scope="module", autouse=True)
def first_heartbeat(store: FederationStore) -> None:
    """What the peer's backends hold is known from its first heartbeat; before it, the peer is
    unreachable and a GPU job is unschedulable for that reason instead."""
    _wait(lambda: any(p.peer_id == "cw-h100" and p.reachable for p in store.peers()), "cw-h100's first heartbeat")


def test_a_job_no_backend_could_ever_hold_fails_at_once_naming_the_largest(deployment, store):
    run = deployment.trigger("e2e_job", {"job": h100(16, "echo never")}, user="alice")
    assert deployment.wait_for_run("e2e_job", run) == "failed"
    log = deployment.task_log("e2e_job", run, "run")
    assert "needs 16 h100 on one backend; the largest that can host it is cw-h100/default with 4 in total" in log
    assert not [j for j in store.list_jobs(limit=1000) if j.origin and j.origin.run_id == run]
    # Pinned to a peer whose backends are all too small, it is rejected too: it could never run there.
    pinned = deployment.trigger(
        "e2e_job", {"job": {**h100(8, "echo never"), "target_cluster": "cw-h100"}}, user="alice"
    )
    assert deployment.wait_for_run("e2e_job", pinned) == "failed"
    assert "cw-h100/default with 4 in total" in deployment.task_log("e2e_job", pinned, "run")


def test_a_big_job_behind_a_stream_of_small_ones_holds_the_backend_and_runs_first(deployment, store, tmp_path):
    gates = {name: tmp_path / name for name in ("s1", "s2")}
    small = {
        name: deployment.trigger("e2e_job", {"job": h100(2, held(gate))}, user="bob") for name, gate in gates.items()
    }
    small_jobs = {name: admitted_job_of(deployment, run) for name, run in small.items()}
    for job_id in small_jobs.values():
        _wait(lambda job_id=job_id: store.get_job(job_id).state is JobState.RUNNING, f"{job_id} to run")
    big_run = deployment.trigger("e2e_job", {"job": h100(4, "echo big")}, user="alice")
    big = admitted_job_of(deployment, big_run)
    _wait(lambda: store.capacity_holds().get(big) == ("cw-h100", "default"), "the big job to hold cw-h100/default")
    late_run = deployment.trigger("e2e_job", {"job": h100(2, "echo small")}, user="bob")
    late = admitted_job_of(deployment, late_run)

    # s1 ends: 2 h100 free up, which the small job behind would take at once without the hold.
    gates["s1"].touch()
    assert deployment.wait_for_run("e2e_job", small["s1"]) == "success"
    ticks(store, 3)
    assert store.get_job(late).handoff_state is HandoffState.QUEUED
    assert store.get_job(big).handoff_state is HandoffState.QUEUED
    explained = deployment.api("GET", f"{API}/jobs/explain", params={"job_id": late}).json()
    assert f"holding cw-h100/default for {big} (waiting" in explained["summary"], explained
    mine = deployment.api("GET", f"{API}/jobs/explain", params={"job_id": big}).json()
    assert mine["status"] == "holding" and "so it holds cw-h100/default" in mine["summary"], mine
    assert "2 of its 4 h100 are available there now" in mine["summary"]
    peers = deployment.api("GET", f"{API}/peers").json()["peers"]
    [backend] = next(p for p in peers if p["peer_id"] == "cw-h100")["backends"]
    assert backend["held_for"]["job_id"] == big
    assert backend["held_for"]["text"].startswith(f"holding cw-h100/default for {big} (waiting ")

    # s2 ends: the big job fits, goes first, and the small one after it.
    gates["s2"].touch()
    for run in (small["s2"], big_run, late_run):
        assert deployment.wait_for_run("e2e_job", run) == "success"
    promoted = {j: next(e.seq for e in store.events(j) if e.kind == "promoted") for j in (big, late)}
    assert promoted[big] < promoted[late]
    assert store.get_job(late).started_at_ms >= store.get_job(big).started_at_ms

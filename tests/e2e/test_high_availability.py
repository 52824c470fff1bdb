"""A highly available parent on the CeleryExecutor, federating to an Airflow peer.

The parent ``marin`` runs what a deployment that outgrew one machine runs: two schedulers, two
triggerers, two api-servers, a dag-processor and a Celery worker (Redis as the broker, PostgreSQL
for the metadata database, Celery's results and the federation store). The peer ``cw-east`` serves
its peer API from two api-servers behind a round-robin proxy (``FaultProxy`` with two upstreams),
the way a load balancer fronts them. Races are made with a held request, a lost answer and killed
processes, never with sleeps. What must hold:

- one placement tick at a time, whichever scheduler queued it and however ticks are started;
- deferred waits spread over both triggerers, and a wait on a killed triggerer is taken over;
- a handoff reaching the peer through either api-server is admitted once per nonce;
- no job is promoted twice.

Each triggerer takes at most ``TRIGGERER_CAPACITY`` triggers ([triggerer] capacity), fewer than
the test's waits plus the placement DAG's wake watcher: Airflow hands unassigned triggers to
whichever triggerer asks first, so only a capacity makes the spread certain rather than likely.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from devtools.airflow_deployment import AirflowDeployment
from devtools.fault_proxy import FaultProxy
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.peers.identity import generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port
from tests.e2e.deployments import deployment_pair
from tests.e2e.jobs import admitted_job_of
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

_wait = partial(wait_for, timeout=180, interval=0.5)

TICK_DAG = "iris_federation_tick"
TRIGGERER_CAPACITY = 3
WAITS = 4  # with the wake watcher, more triggers than one triggerer takes
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


@dataclass
class HighlyAvailable:
    parent: AirflowDeployment
    peer: AirflowDeployment
    parent_store: FederationStore
    peer_store: FederationStore
    proxy: FaultProxy
    metadata: sa.Engine  # the parent's Airflow database, read as an operator would with psql


@contextmanager
def redis_database() -> Iterator[str]:
    """A Redis database number of its own (claimed with a marker key, flushed afterwards), as the
    broker URL; skips (or, with IRIS_REQUIRE_REDIS=1 as in CI, fails) when Redis is not running."""
    import redis

    try:
        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as error:
        message = f"Redis not reachable at {REDIS_HOST}:{REDIS_PORT} ({error}); start it with scripts/redis.sh"
        if os.environ.get("IRIS_REQUIRE_REDIS") == "1":
            pytest.fail(message + " (IRIS_REQUIRE_REDIS=1)")
        pytest.skip(message)
    claim = uuid.uuid4().hex
    for number in range(1, 16):  # 0 is left to whoever else uses this Redis
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
        if client.set("iris-e2e-claimed", claim, nx=True, ex=3600):
            break
        client.close()
    else:
        pytest.fail("every Redis database 1-15 is claimed by another test run")
    try:
        yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
    finally:
        client.flushdb()
        client.close()


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HighlyAvailable]:
    root = tmp_path_factory.mktemp("high-availability")
    keys = {name: generate_keypair() for name in ("marin", "cw-east")}
    for name, (private, public) in keys.items():
        (root / f"{name}.key").write_text(private)
        (root / f"{name}.pub").write_text(public)
    peer_port, second_peer_port = free_port(), free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{peer_port}", f"http://127.0.0.1:{second_peer_port}").start()
    # A peer call waits up to a minute, so a heartbeat the proxy holds keeps its tick in flight.
    (root / "parent.yaml").write_text(
        """
name: marin
placement: {tick_interval_seconds: 10, sync_interval_seconds: 2}
backends: [{id: cpu, kind: process, max_running_jobs: 4}]
peers: [{id: cw-east, kind: airflow, conn_id: cw_east, allow_insecure_http: true, timeout_seconds: 60}]
"""
    )
    (root / "peer.yaml").write_text(
        f"""
name: cw-east
placement: {{sync_interval_seconds: 2}}
federation:
  private_key: {root / "cw-east.key"}
  trusted_peers: {{marin: {{public_key: {root / "marin.pub"}}}}}
  allowed_submitters: ["alice"]
backends: [{{id: default, kind: process, devices: {{h100: 8}}}}]
"""
    )
    cw_east = {"conn_type": "irisfederationpeer", "host": proxy.url, "password": keys["marin"][0]}
    try:
        with (
            redis_database() as broker,
            deployment_pair(
                root,
                databases="iris_ha",
                logs="high-availability",
                peer_port=peer_port,
                parent_env={
                    "AIRFLOW_CONN_CW_EAST": json.dumps(cw_east),
                    "AIRFLOW__TRIGGERER__CAPACITY": str(TRIGGERER_CAPACITY),
                    # A killed triggerer's triggers go to the other after 15 s without a heartbeat.
                    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
                },
                parent_options={
                    "executor": "celery",
                    "celery_broker_url": broker,
                    "instances": {"scheduler": 2, "triggerer": 2, "api-server": 2},
                    "api_ports": (free_port(),),
                },
                # cw-east's workers reach the Execution API through the same balancer, not one api-server.
                peer_options={
                    "instances": {"api-server": 2},
                    "api_ports": (second_peer_port,),
                    "execution_api_url": f"{proxy.url}/execution/",
                },
            ) as running,
        ):
            metadata = sa.create_engine(running.parent.metadata_url)
            try:
                yield HighlyAvailable(
                    running.parent, running.peer, running.parent_store, running.peer_store, proxy, metadata
                )
            finally:
                metadata.dispose()
    finally:
        proxy.stop()


def gpu(command: str) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 2}}}


def on_peer(job_id: str) -> str:
    return f"marin:{job_id}"


def gated(gate: Any, label: str) -> str:
    return f"while [ ! -e {gate} ]; do sleep 0.2; done; echo {label}"


def wait_holders(ha: HighlyAvailable, run_ids: list[str]) -> dict[str, int | None]:
    """The triggerer (its job id) running each run's deferred wait, None while unassigned."""
    query = sa.text(
        "SELECT ti.run_id, t.triggerer_id FROM task_instance ti JOIN trigger t ON ti.trigger_id = t.id"
        " WHERE ti.dag_id = 'e2e_job' AND ti.task_id = 'run' AND ti.run_id IN :runs"
    ).bindparams(sa.bindparam("runs", expanding=True))
    with ha.metadata.connect() as connection:
        return {row.run_id: row.triggerer_id for row in connection.execute(query, {"runs": run_ids})}


def alive_triggerers(ha: HighlyAvailable) -> set[int]:
    """The triggerers Airflow itself counts as alive (heartbeat within the health check threshold)."""
    response = ha.parent.api("GET", "/api/v2/jobs", params={"job_type": "TriggererJob", "is_alive": "true"})
    response.raise_for_status()
    return {job["id"] for job in response.json()["jobs"]}


def assert_each_nonce_admitted_once(ha: HighlyAvailable, job_ids: list[str]) -> None:
    for job_id in job_ids:
        received = ha.peer_store.get_job(on_peer(job_id))
        assert received is not None, job_id
        assert received.nonce == ha.parent_store.get_job(job_id).nonce
        kinds = [event.kind for event in ha.peer_store.events(on_peer(job_id))]
        assert kinds.count("admitted") == 1 and "resubmitted" not in kinds, (job_id, kinds)
        # Through the balancer: one of cw-east's api-servers may be down.
        listed = ha.peer.api("GET", f"/api/v2/dags/{RUNNER_DAG_ID}/dagRuns", params={"limit": 100}, via=ha.proxy.url)
        runs = listed.json()["dag_runs"]
        assert [r for r in runs if (r.get("conf") or {}).get("job_id") == on_peer(job_id)] != []


def test_the_parent_runs_every_component_twice_and_its_tasks_on_the_celery_worker(ha):
    parent = ha.parent
    twice = ("api-server", "scheduler", "triggerer")
    expected = [*twice, *(f"{component}.2" for component in twice), "dag-processor", "celery-worker"]
    assert sorted(parent.processes) == sorted(expected)
    alive = parent.api("GET", "/api/v2/jobs", params={"is_alive": "true", "limit": 100}).json()["jobs"]
    assert sorted(job["job_type"] for job in alive if job["job_type"] != "DagProcessorJob") == [
        "SchedulerJob",
        "SchedulerJob",
        "TriggererJob",
        "TriggererJob",
    ]
    for url in parent.api_urls():  # either api-server serves the REST API and the federation UI's API
        assert parent.api("GET", "/iris/federation/ui/api/peers", via=url).status_code == 200
    run = parent.trigger("e2e_job", {"job": {"command": "echo on marin"}}, user="alice", via=parent.api_urls()[1])
    assert parent.wait_for_run("e2e_job", run) == "success"
    # The Celery worker ran the task (there is no other executor), and its resumption if it deferred.
    executed = [line for line in parent.log_path("celery-worker").read_text().splitlines() if f"run_id={run}/" in line]
    assert any("Executing workload in Celery" in line for line in executed), executed


def test_waits_spread_over_both_triggerers_and_survive_killing_one(ha, tmp_path):
    parent, gate = ha.parent, tmp_path / "release"
    urls = parent.api_urls()
    runs = [
        parent.trigger("e2e_job", {"job": gpu(gated(gate, f"wait {n}"))}, user="alice", via=urls[n % 2])
        for n in range(WAITS)
    ]
    jobs = [admitted_job_of(parent, run) for run in runs]
    _wait(
        lambda: all(ha.parent_store.get_job(j).state is JobState.RUNNING for j in jobs), "every job to run on cw-east"
    )
    holders = _wait(
        lambda: h if len(h := wait_holders(ha, runs)) == WAITS and None not in h.values() else None,
        "a triggerer to take every wait",
    )
    assert len(set(holders.values())) == 2, holders  # both triggerers hold waits

    parent.kill_component("triggerer")  # a crash: no goodbye, its heartbeat just stops
    survivors = _wait(
        lambda: s if len(s := alive_triggerers(ha) & set(holders.values())) == 1 else None,
        "Airflow to count one triggerer dead",
    )
    (dead,) = set(holders.values()) - survivors
    orphaned = [run for run, holder in holders.items() if holder == dead]
    assert orphaned, holders

    gate.touch()  # every job ends on cw-east; the survivor runs the dead triggerer's waits to the end
    for run in runs:
        assert parent.wait_for_run("e2e_job", run, timeout=300) == "success"
    for run in orphaned:  # resumed from the wait on the first try: nothing failed and retried
        assert parent.task_instance("e2e_job", run, "run")["try_number"] == 1
        assert parent.xcom("e2e_job", run, "run")["state"] == "succeeded"
    # Delivered through both of cw-east's api-servers, each job's nonce admitted there once.
    handoffs = {upstream for path, upstream in ha.proxy.served if path.startswith(f"{API_PREFIX}/handoffs")}
    assert handoffs == set(ha.proxy.upstreams), ha.proxy.served
    assert_each_nonce_admitted_once(ha, jobs)

    parent.start_component("triggerer")  # back to two for the next tests
    parent.wait_healthy()


def test_a_handoff_whose_answer_is_lost_as_its_api_server_dies_is_admitted_once(ha):
    """The delivery reaches one of cw-east's api-servers, which admits it and is killed before
    answering: the parent, not knowing, tries again and reaches the other one (or learns of the
    job from its reports through it); the nonce makes it the same incarnation."""
    parent, peer, proxy = ha.parent, ha.peer, ha.proxy
    instance_at = dict(zip(peer.api_urls(), ("api-server", "api-server.2"), strict=True))
    # The api-server process crashes; the job it started, under a supervisor of its own, runs on.
    proxy.lose_next(
        f"{API_PREFIX}/handoffs",
        lambda: peer.kill_component(instance_at[proxy.lost_upstreams[-1]], descendants=False),
    )
    run = parent.trigger("e2e_job", {"job": gpu("echo delivered once")}, user="alice")
    _wait(lambda: proxy.lost, "the first delivery to reach cw-east")
    job_id = admitted_job_of(parent, run)
    assert parent.wait_for_run("e2e_job", run, timeout=240) == "success"
    killed = instance_at[proxy.lost_upstreams[-1]]
    assert killed not in peer.processes
    survivor = next(url for url in proxy.upstreams if url != proxy.lost_upstreams[-1])
    later = proxy.served[proxy.served.index((f"{API_PREFIX}/handoffs", proxy.lost_upstreams[-1])) + 1 :]
    # The other api-server carried on for cw-east (requests already in flight to the dead one may
    # have been answered just before it died, so only the survivor's share is certain).
    assert any(upstream == survivor for _, upstream in later), later
    assert_each_nonce_admitted_once(ha, [job_id])
    assert ha.peer_store.get_job(on_peer(job_id)).state is JobState.SUCCEEDED
    peer.start_component(killed)
    peer.wait_healthy()


def tick_instances(ha: HighlyAvailable) -> list[tuple[datetime, datetime, int, str]]:
    """(start, end, queued by which scheduler job, run id) of every tick task that ran, by start."""
    query = sa.text(
        "SELECT start_date, end_date, queued_by_job_id, run_id FROM task_instance"
        " WHERE dag_id = :dag AND task_id = 'tick' AND start_date IS NOT NULL ORDER BY start_date"
    )
    with ha.metadata.connect() as connection:
        return [tuple(row) for row in connection.execute(query, {"dag": TICK_DAG})]  # type: ignore[misc]


def scheduler_heartbeats(ha: HighlyAvailable) -> dict[int, datetime]:
    query = sa.text("SELECT id, latest_heartbeat FROM job WHERE job_type = 'SchedulerJob' AND end_date IS NULL")
    with ha.metadata.connect() as connection:
        return {row.id: row.latest_heartbeat for row in connection.execute(query)}


def test_one_tick_at_a_time_whichever_scheduler_and_no_job_promoted_twice(ha):
    """A tick is held in flight (its heartbeat of cw-east kept by the proxy) while both api-servers
    ask for four more and both schedulers loop: none starts until it ends. Then, over every tick of
    this module (scheduled, woken and manual, queued by either scheduler), no two overlapped."""
    parent, proxy = ha.parent, ha.proxy
    hold = proxy.hold_next(f"{API_PREFIX}/backends", timeout=90)
    manual = [parent.trigger(TICK_DAG, via=url) for url in parent.api_urls() for _ in range(2)]
    assert hold.arrived.wait(60), "no tick heartbeated cw-east"
    before = scheduler_heartbeats(ha)
    assert len(before) == 2
    _wait(
        lambda: all(beat > before[job] for job, beat in scheduler_heartbeats(ha).items() if job in before),
        "both schedulers to loop again while the tick is held",
    )
    runs = parent.api("GET", f"/api/v2/dags/{TICK_DAG}/dagRuns", params={"state": "running"}).json()["dag_runs"]
    assert len(runs) == 1, runs
    waiting = [parent.run(TICK_DAG, run)["state"] for run in manual if run != runs[0]["dag_run_id"]]
    assert waiting and all(state == "queued" for state in waiting), waiting
    hold.release()
    for run in manual:
        assert parent.wait_for_run(TICK_DAG, run, timeout=240) == "success"

    ticks = tick_instances(ha)
    assert len(ticks) >= 5
    for (_, end, _, earlier), (start, _, _, later) in itertools.pairwise(ticks):
        assert end is not None and end <= start, f"tick {later} started at {start} before {earlier} ended at {end}"
    assert len({queued_by for _, _, queued_by, _ in ticks}) == 2  # both schedulers queued ticks

    # No double promotion: every job handed to cw-east in this module was promoted exactly once.
    handed = ha.parent_store.list_jobs(peer_id="cw-east", limit=1000)
    assert len(handed) >= WAITS + 1
    for job in handed:
        kinds = [event.kind for event in ha.parent_store.events(job.job_id)]
        assert kinds.count("promoted") == 1, (job.job_id, kinds)
        assert job.handoff_state is not HandoffState.QUEUED

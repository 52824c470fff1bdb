"""Attacks on job ownership and the peer API, against a real deployment that scopes a user to one DAG.

One deployment (api-server, scheduler, dag-processor, triggerer; PostgreSQL) runs Airflow's FAB
auth manager: alice has FAB's ``User`` role (every DAG); mallory's own role allows her one DAG,
``e2e_mallory`` (read, edit, trigger), and the task instances, logs and XComs of that DAG only.
The deployment is also a federation peer: it trusts two clusters, ``marin`` and ``rogue``, whose
calls the tests sign with their real Ed25519 keys over HTTP.

The attacks are issue 11's: mallory names alice's job (by its full id, by a bare name, by another id
in alice's namespace, by an id of a DAG that shares her DAG's service principal) in her run's
``conf``, reads or cancels it through the Federation page's API, watches it with a sensor; peers
call without a token, with an untrusted one, ask about each other's jobs and reuse each other's job
ids. Each is refused, and alice's job (or marin's) is left exactly as it was. Each test also shows
the same request succeeding for the job's owner, so a refusal is the protection, not a broken setup.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.peers.identity import TokenMinter, generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.store.records import JobEvent, JobRecord
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import free_port, migrated_store, save_logs
from tests.postgres import scratch_database
from tests.waiting import wait_for

# Real services take seconds per step: wait longer, and poll less often, than unit tests do.
_wait = partial(wait_for, timeout=120, interval=0.5)

pytestmark = pytest.mark.e2e

UI_API = "/iris/federation/ui/api"
MALLORY_DAG = "e2e_mallory"
# Mallory's role: her DAG (read, edit, trigger), and the kinds of things DAGs have (runs, task
# instances, logs, XComs), which FAB grants only on the DAGs the role may read or edit.
MALLORY_PERMISSIONS = [
    ("can_read", f"DAG:{MALLORY_DAG}"),
    ("can_edit", f"DAG:{MALLORY_DAG}"),
    ("can_create", f"DAG Run:{MALLORY_DAG}"),
    ("can_read", "DAG Runs"),
    ("can_edit", "DAG Runs"),
    ("can_read", "Task Instances"),
    ("can_edit", "Task Instances"),
    ("can_read", "Task Logs"),
    ("can_read", "XComs"),
]
NAMESPACE_RULE = "is outside the submitter's namespace"
TAKEN = "is already used by another DAG, task or user; give this job another job_id"
SENSOR_MISSING = "is not in the federation store, or was not submitted by this DAG"


@dataclass
class World:
    deployment: AirflowDeployment
    store: FederationStore
    flags: Path  # a job waiting on a flag file ends when the test creates it
    keys: dict[str, tuple[str, str]]  # cluster -> (private PEM, public PEM)

    def token(self, cluster: str) -> str:
        """A fresh signed token of ``cluster`` for this deployment, ``cw-east`` (one per call, single
        use, as a real peer mints them)."""
        return TokenMinter(cluster, self.keys[cluster][0]).mint("cw-east")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("security")
    keys = {name: generate_keypair() for name in ("marin", "rogue", "stranger")}
    for name, (private, public) in keys.items():
        (root / f"{name}.key").write_text(private)
        (root / f"{name}.pub").write_text(public)
    (root / "flags").mkdir()
    (root / "cluster.yaml").write_text(
        f"""
name: cw-east
placement: {{tick_interval_seconds: 30, sync_interval_seconds: 2}}
federation:
  trusted_peers:
    marin: {{public_key: {root / "marin.pub"}}}
    rogue: {{public_key: {root / "rogue.pub"}}}
  allowed_submitters: ["*"]
  service_principals: {{team-svc: [e2e_team, e2e_mallory]}}  # two DAGs sharing one principal
backends: [{{id: cpu, kind: process, max_running_jobs: 8}}]
"""
    )
    with scratch_database("iris_sec_meta") as metadata_url, scratch_database("iris_sec_store") as store_url:
        deployment = AirflowDeployment(
            home=root / "airflow",
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            cluster_config=root / "cluster.yaml",
            dags_folder=Path(__file__).parent / "dags",
            auth_manager="fab",
            # Nothing here kills a component: on a loaded machine, let a late scheduler heartbeat not
            # reset the tasks it runs (which cancels their jobs), and a task wait for a slow api-server
            # (its first execution-API calls take tens of seconds there) instead of failing.
            extra_env={
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "120",
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            },
        )
        store = migrated_store(store_url)
        world = World(deployment, store, root / "flags", keys)
        try:
            deployment.start()
            for dag_id in (MALLORY_DAG, "e2e_team", "e2e_job", RUNNER_DAG_ID):
                deployment.wait_for_dag(dag_id)
            # DAG:e2e_mallory exists once the dag-processor has parsed the DAG (FAB syncs it then).
            deployment.create_role("Mallory", MALLORY_PERMISSIONS)
            deployment.create_user("mallory", ["Mallory"])
            yield world
        finally:
            try:
                _end_every_job(world)
            finally:
                deployment.stop()
                save_logs(deployment, "security")
                store.dispose()


def _end_every_job(world: World) -> None:
    """Nothing may outlive the deployment: process-backend jobs run detached from it."""
    for flag in ("alice", "team", "marin", "rogue"):
        (world.flags / flag).touch()
    live = [job.job_id for job in world.store.list_jobs(limit=1000) if not job.terminal]
    for job_id in live:
        world.deployment.api("POST", f"{UI_API}/jobs/cancel", params={"job_id": job_id})
    _wait(lambda: all(world.store.get_job(j).terminal for j in live), "every job to end")


# Helpers -------------------------------------------------------------------------------------------------------


def waiting_job(world: World, flag: str, output: str, **extra: Any) -> dict[str, Any]:
    """A job that prints ``output``, then runs until the test creates its flag file."""
    path = world.flags / flag
    return {"command": f"echo {output}; while [ ! -e {path} ]; do sleep 0.2; done; echo {output}-done", **extra}


def ui(world: World, method: str, path: str, user: str, **kwargs: Any) -> httpx.Response:
    return world.deployment.api(method, f"{UI_API}{path}", user=user, **kwargs)


def peer(world: World, method: str, path: str, token: str | None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"{world.deployment.base_url}{API_PREFIX}{path}"
    return httpx.request(method, url, headers=headers, timeout=30, **kwargs)


def job_id_of(world: World, dag_id: str, run_id: str) -> str:
    def lookup() -> str | None:
        try:
            return str(world.deployment.xcom(dag_id, run_id, "run", key="iris_federation_job_id"))
        except httpx.HTTPStatusError as error:
            if error.response.status_code != 404:
                raise
        state = world.deployment.task_instance(dag_id, run_id, "run").get("state")
        assert state not in ("failed", "upstream_failed"), world.deployment.task_log(dag_id, run_id, "run")
        return None

    return str(_wait(lookup, f"the job id of {dag_id} {run_id}"))


def running_with_output(world: World, job_id: str, owner: str, output: str) -> JobRecord:
    """``job_id`` once it runs and its output has reached the store (so it could be relayed)."""

    def ready() -> bool:
        job = world.store.get_job(job_id)
        if job is None or job.state is not JobState.RUNNING:
            return False
        described = ui(world, "GET", "/jobs/describe", owner, params={"job_id": job_id}).json()
        return any(output in line for line in described["output_tail"])

    _wait(ready, f"{job_id} to run and print {output}")
    job = world.store.get_job(job_id)
    assert job is not None
    return job


def mallory_run(world: World, conf: dict[str, Any]) -> str:
    return world.deployment.trigger(MALLORY_DAG, conf, user="mallory")


def task_state(world: World, run_id: str, task_id: str = "run") -> str:
    return str(world.deployment.task_instance(MALLORY_DAG, run_id, task_id).get("state"))


def history(world: World, job_id: str) -> list[tuple[int, str]]:
    return [(event.seq, event.kind) for event in _events(world, job_id)]


def _events(world: World, job_id: str) -> list[JobEvent]:
    return world.store.events(job_id)


def untouched(world: World, before: JobRecord, events: list[tuple[int, str]]) -> JobRecord:
    """``before``'s job as it is now, after checking no one else changed it: same incarnation, no
    cancel asked, no event added."""
    now = world.store.get_job(before.job_id)
    assert now is not None
    assert (now.nonce, now.cancel_requested, now.submitting_user) == (before.nonce, False, before.submitting_user)
    assert now.origin == before.origin
    assert history(world, before.job_id) == events
    return now


def only_refusals(log: str, job_id: str, refusal: str) -> bool:
    """Whether every line of ``log`` naming ``job_id`` is the refusal (none describes the job)."""
    mentions = [line for line in log.splitlines() if job_id in line]
    return bool(mentions) and all(refusal in line for line in mentions)


def mallory_jobs(world: World) -> list[JobRecord]:
    return [job for job in world.store.list_jobs(limit=1000) if job.origin and job.origin.dag_id == MALLORY_DAG]


# Alice's job, which mallory goes after ---------------------------------------------------------------------


@dataclass
class Victim:
    job_id: str
    run_id: str
    secret: str
    record: JobRecord


@pytest.fixture(scope="module")
def alice(world: World) -> Victim:
    secret = f"alice-secret-{secrets.token_hex(6)}"
    run_id = world.deployment.trigger(
        "e2e_job", {"job": {"job_id": "secret-train", **waiting_job(world, "alice", secret)}}, user="alice"
    )
    job_id = job_id_of(world, "e2e_job", run_id)
    assert job_id == "/alice/secret-train"  # a bare name goes under its submitter's namespace
    return Victim(job_id, run_id, secret, running_with_output(world, job_id, "alice", secret))


# Naming alice's job in mallory's conf ------------------------------------------------------------------------


def test_mallory_cannot_reattach_to_cancel_or_rerun_alices_job_by_naming_it_in_conf(world, alice):
    deployment = world.deployment
    events = history(world, alice.job_id)
    job = {"command": "echo mallory was here"}
    attacks = {  # what -> (the id named, the run)
        "her full id": (alice.job_id, mallory_run(world, {"job": {**job, "job_id": alice.job_id}})),
        "another id in her namespace": ("/alice/other", mallory_run(world, {"job": {**job, "job_id": "/alice/other"}})),
    }
    for what, (named, run_id) in attacks.items():
        assert deployment.wait_for_run(MALLORY_DAG, run_id) == "failed", what
        assert task_state(world, run_id) == "failed", what
        log = deployment.task_log(MALLORY_DAG, run_id, "run")
        assert NAMESPACE_RULE in log and "job ids are /mallory/<name>" in log, (what, log)
        assert alice.secret not in log and only_refusals(log, named, NAMESPACE_RULE), what  # no word of her job
    # Refused before anything was written: no job of mallory's DAG, nothing under the other id.
    assert mallory_jobs(world) == [] and world.store.get_job("/alice/other") is None

    # Marking her task failed (what cancelled the job when a task had reattached to it) changes nothing.
    marked = deployment.api(
        "PATCH",
        f"/api/v2/dags/{MALLORY_DAG}/dagRuns/{quote(attacks['her full id'][1], safe='')}/taskInstances/run",
        user="mallory",
        json={"new_state": "failed"},
    )
    # (A no-op here: her task failed on its own, before it could wait on anything.)
    assert marked.status_code == 200 or "already in failed state" in marked.text, marked.text
    assert untouched(world, alice.record, events).state is JobState.RUNNING

    # Alice's job runs to its end: never cancelled, and its output reaches her own task log only.
    (world.flags / "alice").touch()
    assert deployment.wait_for_run("e2e_job", alice.run_id) == "success"
    ended = world.store.get_job(alice.job_id)
    assert ended is not None and ended.state is JobState.SUCCEEDED and ended.nonce == alice.record.nonce
    assert alice.secret in deployment.task_log("e2e_job", alice.run_id, "run")

    # Once it has ended, naming it does not run it again as mallory's.
    events = history(world, alice.job_id)
    rerun = mallory_run(world, {"job": {**job, "job_id": alice.job_id}})
    assert deployment.wait_for_run(MALLORY_DAG, rerun) == "failed"
    log = deployment.task_log(MALLORY_DAG, rerun, "run")
    assert NAMESPACE_RULE in log and alice.secret not in log
    assert untouched(world, ended, events).state is JobState.SUCCEEDED
    assert mallory_jobs(world) == []


def test_a_bare_name_is_mallorys_own_job_in_her_namespace_and_never_alices(world, alice):
    events = history(world, alice.job_id)
    run_id = mallory_run(world, {"job": {"command": "echo mallory own job", "job_id": "secret-train"}})
    assert world.deployment.wait_for_run(MALLORY_DAG, run_id) == "success"
    assert job_id_of(world, MALLORY_DAG, run_id) == "/mallory/secret-train"
    own = world.store.get_job("/mallory/secret-train")
    assert own is not None and own.submitting_user == "mallory" and own.state is JobState.SUCCEEDED
    log = world.deployment.task_log(MALLORY_DAG, run_id, "run")
    assert "mallory own job" in log and alice.secret not in log
    assert history(world, alice.job_id) == events
    assert world.store.get_job(alice.job_id).nonce == alice.record.nonce


def test_a_dag_sharing_her_dags_service_principal_cannot_take_its_jobs(world):
    """Two DAGs that submit as one service principal share its namespace; the job is still the DAG's."""
    deployment = world.deployment
    team_run = deployment.trigger(
        "e2e_team", {"job": {"job_id": "nightly", **waiting_job(world, "team", "team-output")}}, user="alice"
    )
    team_job = job_id_of(world, "e2e_team", team_run)
    assert team_job == "/team-svc/nightly"
    record = running_with_output(world, team_job, "alice", "team-output")
    events = history(world, team_job)
    attack = {"as_team": True, "job": {"job_id": "nightly", "command": "echo mallory as the team"}}
    run_id = mallory_run(world, attack)
    assert deployment.wait_for_run(MALLORY_DAG, run_id) == "failed"
    log = deployment.task_log(MALLORY_DAG, run_id, "run")
    # The refusal names the rule, and nothing about the job behind the id.
    assert f"AirflowFailException: job_id {team_job} {TAKEN}" in log.splitlines(), log
    assert "team-output" not in log and "e2e_team" not in log and only_refusals(log, team_job, TAKEN)
    assert untouched(world, record, events).state is JobState.RUNNING
    # Once it has ended, it is still not hers to run again.
    (world.flags / "team").touch()
    assert deployment.wait_for_run("e2e_team", team_run) == "success"
    ended = world.store.get_job(team_job)
    events = history(world, team_job)
    rerun = mallory_run(world, attack)
    assert deployment.wait_for_run(MALLORY_DAG, rerun) == "failed"
    assert TAKEN in deployment.task_log(MALLORY_DAG, rerun, "run")
    assert untouched(world, ended, events).state is JobState.SUCCEEDED


def test_a_sensor_in_mallorys_dag_is_told_alices_job_is_missing(world, alice):
    run_id = mallory_run(world, {"job": {"command": "echo mine"}, "watch_job_id": alice.job_id})
    assert world.deployment.wait_for_run(MALLORY_DAG, run_id) == "failed"
    assert (task_state(world, run_id, "run"), task_state(world, run_id, "watch")) == ("success", "failed")
    log = world.deployment.task_log(MALLORY_DAG, run_id, "watch")
    assert f"Job {alice.job_id} {SENSOR_MISSING}" in log, log
    # Told exactly what it is told of an id nobody uses: not the job's state, nor its output.
    assert only_refusals(log, alice.job_id, SENSOR_MISSING) and alice.secret not in log
    # The same sensor watching her own job (no watch_job_id) succeeds: the refusal is the rule.
    own = mallory_run(world, {"job": {"command": "echo mine again"}})
    assert world.deployment.wait_for_run(MALLORY_DAG, own) == "success"


# The Federation page's API with mallory's own token --------------------------------------------------------


def test_mallory_cannot_read_describe_explain_or_cancel_alices_job_through_the_ui_api(world, alice):
    events = history(world, alice.job_id)
    nowhere = f"/alice/never-{uuid.uuid4().hex[:8]}"
    for method, path in (("GET", "/jobs/describe"), ("GET", "/jobs/explain"), ("POST", "/jobs/cancel")):
        hers = ui(world, method, path, "mallory", params={"job_id": alice.job_id})
        missing = ui(world, method, path, "mallory", params={"job_id": nowhere})
        assert hers.status_code in (403, 404), (path, hers.text)
        # Indistinguishable from an id that does not exist: nothing says the job is there.
        assert (hers.status_code, hers.json()["detail"].replace(alice.job_id, nowhere)) == (
            missing.status_code,
            missing.json()["detail"],
        ), path
        assert alice.secret not in hers.text and "e2e_job" not in hers.text
        if method == "GET":  # alice herself may read it
            assert ui(world, method, path, "alice", params={"job_id": alice.job_id}).status_code == 200, path
    assert history(world, alice.job_id) == events
    assert world.store.get_job(alice.job_id).cancel_requested is False


def test_the_job_list_shows_mallory_only_the_jobs_of_her_dag(world, alice):
    for query in ({}, {"q": "secret"}, {"dag_id": "e2e_job"}, {"submitter": "alice"}, {"active": "false"}):
        body = ui(world, "GET", "/jobs", "mallory", params=query).json()
        listed = {row["job_id"] for row in body["jobs"]}
        assert alice.job_id not in listed and "/team-svc/nightly" not in listed, (query, listed)
        assert all(row["dag_id"] == MALLORY_DAG for row in body["jobs"]), (query, body["jobs"])
        assert "alice" not in body["facets"]["submitters"] and "team-svc" not in body["facets"]["submitters"]
    own = ui(world, "GET", "/jobs", "mallory", params={"q": "secret"}).json()
    assert [row["job_id"] for row in own["jobs"]] == ["/mallory/secret-train"]  # her own job is listed
    assert alice.job_id in {row["job_id"] for row in ui(world, "GET", "/jobs", "alice").json()["jobs"]}


# The peer API over HTTP ----------------------------------------------------------------------------------------


def handoff(world: World, requester: str, job_id: str, nonce: str, spec: dict[str, Any]) -> httpx.Response:
    body = {"job_id": job_id, "nonce": nonce, "requester": requester, "submitting_user": "alice", "spec": spec}
    return peer(world, "POST", "/handoffs", world.token(requester), json=body)


@pytest.fixture(scope="module")
def marin_job(world: World) -> tuple[str, str, str]:
    """A job marin handed to this cluster, running: (its id as marin knows it, its nonce, its output)."""
    output = f"marin-secret-{secrets.token_hex(6)}"
    nonce = uuid.uuid4().hex
    answer = handoff(world, "marin", "/alice/shared", nonce, waiting_job(world, "marin", output))
    assert answer.status_code == 200, answer.text
    running_with_output(world, "marin:/alice/shared", "admin", output)
    return "/alice/shared", nonce, output


def test_unauthenticated_and_untrusted_callers_are_refused_and_nothing_is_written(world, marin_job):
    job_id, nonce, _ = marin_job
    before = {job.job_id: job.nonce for job in world.store.list_jobs(limit=1000)}
    marin_private = world.keys["marin"][0]
    tokens = {
        "no token": None,
        "not a JWT": "not-a-jwt",
        "an untrusted issuer": TokenMinter("stranger", world.keys["stranger"][0]).mint("cw-east"),
        "marin's name, another key": TokenMinter("marin", world.keys["stranger"][0]).mint("cw-east"),
        "marin's token for another cluster": TokenMinter("marin", world.keys["marin"][0]).mint("cw-west"),
    }
    body = {"job_id": "/alice/sneaky", "nonce": "n", "requester": "stranger", "submitting_user": "alice", "spec": {}}
    calls = [
        ("GET", "/backends", {}),
        ("POST", "/handoffs", {"json": {**body, "spec": {"command": "echo pwned"}}}),
        ("POST", "/sync", {"json": {"cursor": ""}}),
        ("POST", "/terminate", {"json": {"job_id": job_id, "nonce": nonce}}),
        ("GET", "/logs", {"params": {"job_id": job_id}}),
    ]
    for what, token in tokens.items():
        for method, path, kwargs in calls:
            response = peer(world, method, path, token, **kwargs)
            assert response.status_code == 401, (what, path, response.text)
            assert response.json()["code"] == "unauthenticated", (what, path)
            assert "marin-secret" not in response.text
    assert {job.job_id: job.nonce for job in world.store.list_jobs(limit=1000)} == before
    assert world.store.get_job("marin:/alice/shared").state is JobState.RUNNING
    # The same calls with marin's own token go through: the refusals are the tokens'.
    assert peer(world, "GET", "/backends", TokenMinter("marin", marin_private).mint("cw-east")).status_code == 200


def test_a_trusted_peer_cannot_sync_terminate_or_read_another_peers_job(world, marin_job):
    job_id, nonce, output = marin_job
    record = world.store.get_job("marin:/alice/shared")
    events = history(world, record.job_id)
    synced = peer(world, "POST", "/sync", world.token("rogue"), json={"cursor": ""}).json()
    assert synced["deltas"] == []
    nowhere = f"/alice/never-{uuid.uuid4().hex[:8]}"
    for method, path, kwargs in (
        ("POST", "/terminate", {"json": {"job_id": job_id}}),
        ("POST", "/terminate", {"json": {"job_id": job_id, "nonce": nonce}}),
        ("GET", "/logs", {"params": {"job_id": job_id}}),
    ):
        refused = peer(world, method, path, world.token("rogue"), **kwargs)
        assert refused.status_code == 404, (path, refused.text)
        kwargs_elsewhere = {k: {**v, "job_id": nowhere} for k, v in kwargs.items()}
        missing = peer(world, method, path, world.token("rogue"), **kwargs_elsewhere)
        # Just as for an id nobody uses: nothing says marin's job is there.
        assert refused.json() == {**missing.json(), "message": missing.json()["message"].replace(nowhere, job_id)}
        assert output not in refused.text
    assert untouched(world, record, events).state is JobState.RUNNING
    # Marin itself sees, and reads, its job.
    mine = peer(world, "POST", "/sync", world.token("marin"), json={"cursor": ""}).json()
    assert job_id in {delta["job_id"] for delta in mine["deltas"]}
    assert output in "\n".join(
        peer(world, "GET", "/logs", world.token("marin"), params={"job_id": job_id}).json()["lines"]
    )


def test_a_peer_reusing_another_peers_job_id_and_nonce_gets_its_own_job_and_learns_nothing(world, marin_job):
    job_id, nonce, marin_output = marin_job
    marin = world.store.get_job("marin:/alice/shared")
    events = history(world, marin.job_id)
    answer = handoff(world, "rogue", job_id, nonce, waiting_job(world, "rogue", "rogue-output"))
    assert answer.status_code == 200, answer.text
    status = answer.json()
    assert status["replay"] is False and status["job"]["job_id"] == job_id and status["job"]["nonce"] == nonce
    assert marin_output not in answer.text
    rogue = world.store.get_job("rogue:/alice/shared")
    assert rogue is not None and rogue.direction is Direction.RECEIVED and rogue.peer_id == "rogue"
    assert rogue.job_spec.command != marin.job_spec.command
    running_with_output(world, rogue.job_id, "admin", "rogue-output")
    lines = peer(world, "GET", "/logs", world.token("rogue"), params={"job_id": job_id}).json()["lines"]
    assert "rogue-output" in "\n".join(lines) and marin_output not in "\n".join(lines)
    synced = peer(world, "POST", "/sync", world.token("rogue"), json={"cursor": ""}).json()
    assert [(d["job_id"], d["nonce"]) for d in synced["deltas"]] == [(job_id, nonce)]
    # Rogue cancelling "its" job ends its own, never marin's.
    killed = peer(world, "POST", "/terminate", world.token("rogue"), json={"job_id": job_id})
    assert killed.status_code == 200
    _wait(lambda: world.store.get_job(rogue.job_id).state is JobState.KILLED, "rogue's job to be killed")
    assert untouched(world, marin, events).state is JobState.RUNNING
    mine = peer(world, "GET", "/logs", world.token("marin"), params={"job_id": job_id}).json()["lines"]
    assert marin_output in "\n".join(mine) and "rogue-output" not in "\n".join(mine)

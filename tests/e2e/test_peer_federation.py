"""Two Airflow deployments federating over the network: parent ``marin`` and peer ``cw-east``.

Both run the provider on their own AIRFLOW_HOME, port, metadata database and federation store
(PostgreSQL): the pair of ``tests/e2e/shared_federation.py``, which other modules use too. The
parent reaches the peer's API through a loopback proxy that can lose one answer on purpose; calls
are signed with real Ed25519 keys; the peer trusts the parent's public key and admits submitters
``*@example.com`` and ``alice``. The peer's ``one-at-a-time`` backend queues work at its
``max_running_jobs``, so the parent must not take its advertised free devices at face value.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import httpx
import pytest

from devtools.airflow_deployment import AirflowDeployment
from iris_airflow_provider.backends.process.backend import job_directory_name
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.peers.identity import TokenMinter, generate_keypair
from iris_airflow_provider.peers.wire import API_PREFIX
from tests.e2e.jobs import admitted_job_of, job_of
from tests.e2e.shared_federation import Federation
from tests.waiting import wait_for

# Real services take seconds per step: wait longer, and poll less often, than unit tests do.
_wait = partial(wait_for, timeout=120, interval=0.5)

pytestmark = pytest.mark.e2e


def gpu(command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 2}}, **extra}


def on_peer(job_id: str) -> str:
    """Where the peer keeps a job marin handed it: in marin's namespace."""
    return f"marin:{job_id}"


def runner_runs(peer: AirflowDeployment, job_id: str) -> list[dict[str, Any]]:
    runs = peer.api("GET", f"/api/v2/dags/{RUNNER_DAG_ID}/dagRuns", params={"limit": 100}).json()["dag_runs"]
    return [run for run in runs if (run.get("conf") or {}).get("job_id") == job_id]


def call_peer(federation: Federation, method: str, path: str, token: str | None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.request(method, f"{federation.peer.base_url}{API_PREFIX}{path}", headers=headers, timeout=30, **kwargs)


def test_a_job_triggered_on_the_parent_runs_on_the_peer_under_the_same_id(federation):
    parent, peer = federation.parent, federation.peer
    run = parent.trigger(
        "e2e_job",
        {"job": gpu("echo hello from $IRIS_JOB_ID; cat notes.txt", files={"notes.txt": "travelled inline"})},
        user="alice",
    )
    assert parent.wait_for_run("e2e_job", run) == "success"
    job_id = job_of(parent, run)
    result = parent.xcom("e2e_job", run, "run")
    assert (result["peer_id"], result["state"]) == ("cw-east", "succeeded")
    mirrored = federation.parent_store.get_job(job_id)
    received = federation.peer_store.get_job(on_peer(job_id))
    assert (received.direction, received.peer_id, received.submitting_user) == (Direction.RECEIVED, "marin", "alice")
    assert received.nonce == mirrored.nonce and received.state is JobState.SUCCEEDED
    (runner,) = runner_runs(peer, on_peer(job_id))
    assert runner["state"] == "success" and runner["triggering_user_name"] == "alice"
    # The peer's output came back into the parent task's log, files included.
    log = parent.task_log("e2e_job", run, "run")
    assert f"hello from {job_id}" in log and "travelled inline" in log
    assert "Handed off to peer cw-east; awaiting first status report" in result["pending_reasons"] or (
        "Awaiting acceptance by peer cw-east" in result["pending_reasons"]
    )


def test_a_submitter_the_peer_does_not_admit_is_rejected_and_nothing_runs_there(federation):
    run = federation.parent.trigger("e2e_job", {"job": gpu("echo never")}, user="bob")
    assert federation.parent.wait_for_run("e2e_job", run) == "failed"
    job_id = job_of(federation.parent, run)
    job = federation.parent_store.get_job(job_id)
    assert job.handoff_state is HandoffState.REJECTED and job.state is JobState.KILLED
    assert (
        job.error == "Peer cw-east rejected the handoff: Submitter 'bob' is not admitted for federation to this cluster"
    )
    assert federation.peer_store.get_job(on_peer(job_id)) is None
    assert runner_runs(federation.peer, on_peer(job_id)) == []
    assert "Peer cw-east rejected the handoff" in federation.parent.task_log("e2e_job", run, "run")


def test_forged_expired_and_misdirected_tokens_are_refused(federation):
    marin_key, _ = federation.keys["marin"]
    good = TokenMinter("marin", marin_key).mint("cw-east")
    assert call_peer(federation, "GET", "/backends", good).status_code == 200
    forged = TokenMinter("marin", generate_keypair()[0]).mint("cw-east")  # signed with someone else's key
    expired = TokenMinter("marin", marin_key, clock=lambda: time.time() - 3600).mint("cw-east")
    stranger = TokenMinter("nobody", generate_keypair()[0]).mint("cw-east")
    for token in (None, "not-a-jwt", forged, expired, stranger, _wrong_audience(marin_key)):
        response = call_peer(federation, "GET", "/backends", token)
        assert response.status_code == 401, (token, response.text)
        assert response.json()["code"] == "unauthenticated"
    # A trusted peer may only see and act on the jobs it handed off itself.
    run = federation.parent.trigger("e2e_job", {"job": gpu("sleep 1")}, user="alice")
    assert federation.parent.wait_for_run("e2e_job", run) == "success"
    job_id = job_of(federation.parent, run)
    rogue = partial(TokenMinter("rogue", federation.keys["rogue"][0]).mint, "cw-east")
    synced = call_peer(federation, "POST", "/sync", rogue(), json={"cursor": ""}).json()
    assert synced["deltas"] == []
    assert call_peer(federation, "POST", "/terminate", rogue(), json={"job_id": job_id}).status_code == 404
    assert call_peer(federation, "GET", "/logs", rogue(), params={"job_id": job_id}).status_code == 404
    spoof = call_peer(
        federation,
        "POST",
        "/handoffs",
        rogue(),
        json={"job_id": "/alice/spoof", "nonce": "n", "requester": "marin", "submitting_user": "alice", "spec": {}},
    )
    assert spoof.status_code == 403 and "does not match the authenticated peer 'rogue'" in spoof.json()["message"]
    marin_view = call_peer(
        federation, "POST", "/sync", TokenMinter("marin", marin_key).mint("cw-east"), json={"cursor": ""}
    )
    assert job_id in {delta["job_id"] for delta in marin_view.json()["deltas"]}


def _wrong_audience(private_key: str) -> str:
    import jwt
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_key.encode(), password=None)
    now = int(time.time())
    claims = {
        "iss": "marin",
        "sub": "marin",
        "aud": "airflow",
        "role": "federation-peer",
        "iat": now,
        "exp": now + 60,
        "jti": "x",
    }
    return jwt.encode(claims, key, algorithm="EdDSA")


def test_cancelling_on_the_parent_kills_the_job_on_the_peer(federation):
    run = federation.parent.trigger("e2e_job", {"job": gpu("sleep 300")}, user="alice")
    federation.parent.wait_for_task_state("e2e_job", run, "run", ("deferred",))
    job_id = job_of(federation.parent, run)
    _wait(
        lambda: (j := federation.peer_store.get_job(on_peer(job_id))) is not None and j.state is JobState.RUNNING,
        "the job to run on the peer",
    )
    federation.parent.set_run_state("e2e_job", run, "failed")
    _wait(lambda: federation.peer_store.get_job(on_peer(job_id)).state is JobState.KILLED, "the peer to kill the job")
    _wait(lambda: federation.parent_store.get_job(job_id).state is JobState.KILLED, "the parent to mirror it")
    _wait(
        lambda: runner_runs(federation.peer, on_peer(job_id))[0]["state"] == "failed", "the peer's runner run to fail"
    )


def test_a_handoff_whose_answer_is_lost_while_the_peer_api_server_restarts_is_delivered_once(federation):
    peer = federation.peer
    federation.proxy.lose_next(f"{API_PREFIX}/handoffs", lambda: peer.stop_component("api-server"))
    run = federation.parent.trigger("e2e_job", {"job": gpu("echo delivered once")}, user="alice")
    _wait(lambda: federation.proxy.lost, "the first delivery to reach the peer")
    job_id = next(
        j.job_id for j in federation.parent_store.list_jobs(limit=1000) if j.origin and j.origin.run_id == run
    )
    _wait(
        lambda: federation.parent_store.get_job(job_id).delivery_attempts >= 1, "the parent to count a failed delivery"
    )
    assert federation.parent_store.get_job(job_id).handoff_state is HandoffState.PENDING
    peer.start_component("api-server")
    peer.wait_healthy()
    assert federation.parent.wait_for_run("e2e_job", run, timeout=240) == "success"
    # Whether the parent learnt of the delivery by replaying it or from the peer's next report,
    # the peer admitted it once, recorded one run, and ran it once.
    kinds = [e.kind for e in federation.peer_store.events(on_peer(job_id))]
    assert kinds.count("admitted") == 1 and "resubmitted" not in kinds
    assert len(runner_runs(peer, on_peer(job_id))) == 1
    assert federation.peer_store.get_job(on_peer(job_id)).nonce == federation.parent_store.get_job(job_id).nonce
    jobs_dir = peer.home / "iris" / "cw-east" / "default" / "jobs"
    incarnations = list(jobs_dir.glob(job_directory_name(on_peer(job_id)) + "*"))
    assert incarnations == [jobs_dir / job_directory_name(on_peer(job_id))]
    assert json.loads((incarnations[0] / "status.json").read_text())["attempts"] == 1


def test_resubmitting_a_finished_job_runs_it_again_as_a_new_incarnation(federation):
    job = gpu("echo incarnation $IRIS_JOB_NONCE", job_id="/alice/nightly-eval")
    first = federation.parent.trigger("e2e_job", {"job": job}, user="alice")
    assert federation.parent.wait_for_run("e2e_job", first) == "success"
    first_nonce = federation.peer_store.get_job(on_peer("/alice/nightly-eval")).nonce
    second = federation.parent.trigger("e2e_job", {"job": job}, user="alice")
    assert federation.parent.wait_for_run("e2e_job", second) == "success"
    received = federation.peer_store.get_job(on_peer("/alice/nightly-eval"))
    assert received.nonce != first_nonce and received.state is JobState.SUCCEEDED
    assert "resubmitted" in [e.kind for e in federation.parent_store.events("/alice/nightly-eval")]
    assert sorted(r["state"] for r in runner_runs(federation.peer, on_peer("/alice/nightly-eval"))) == [
        "success",
        "success",
    ]


def test_the_result_a_job_writes_on_the_peer_reaches_the_parents_xcom_and_a_downstream_task(federation):
    parent, job_id = federation.parent, "/alice/with-result"
    writes = """printf '{"loss": 0.25, "checkpoint": "s3://ckpt/%s"}' "$IRIS_JOB_NONCE" > "$IRIS_RESULT\""""
    # The parent loses one sync answer on the way: the peer's store still has the result to send again.
    federation.proxy.lose_next(f"{API_PREFIX}/sync", lambda: None)
    first = parent.trigger("e2e_result", {"job": gpu(f"echo training; {writes}", job_id=job_id)}, user="alice")
    assert parent.wait_for_run("e2e_result", first) == "success"
    nonce = federation.peer_store.get_job(on_peer(job_id)).nonce
    expected = {"loss": 0.25, "checkpoint": f"s3://ckpt/{nonce}"}
    outcome = parent.xcom("e2e_result", first, "run")
    assert (outcome["peer_id"], outcome["state"], outcome["result"]) == ("cw-east", "succeeded", expected)
    assert parent.xcom("e2e_result", first, "use_result") == f"loss 0.25 at s3://ckpt/{nonce}"
    assert json.loads(federation.peer_store.job_result(on_peer(job_id), nonce) or "") == expected
    assert "training" in parent.task_log("e2e_result", first, "run")
    # Run again, writing nothing: the new incarnation hands nothing back, not the first one's result.
    second = parent.trigger("e2e_result", {"job": gpu("echo no result", job_id=job_id)}, user="alice")
    assert parent.wait_for_run("e2e_result", second) == "success"
    again = parent.xcom("e2e_result", second, "run")
    assert again["state"] == "succeeded" and again["result"] is None
    assert parent.xcom("e2e_result", second, "use_result") == "no result"
    assert federation.peer_store.get_job(on_peer(job_id)).nonce != nonce


def a100(count: int, command: str) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": "a100", "count": count}}}


def heartbeats_after(federation: Federation, count: int) -> None:
    """Wait until the parent has heartbeated the peer ``count`` more times (ticks, not seconds)."""
    seen: set[int] = set()

    def enough() -> bool:
        record = next(p for p in federation.parent_store.peers() if p.peer_id == "cw-east")
        if record.last_contact_ms is not None:
            seen.add(record.last_contact_ms)
        return len(seen) > count

    _wait(enough, f"{count} more heartbeats of cw-east")


def test_a_peer_backend_that_queues_work_is_never_double_booked(federation, tmp_path):
    """8 a100, one job at a time: while one runs on 2, the peer advertises 6 free on every heartbeat,
    and a job handed to it waits in its queue holding nothing. The parent hands it one 4-GPU job, not
    one per tick, and the next only once the peer's reports show the first running there."""
    parent, store = federation.parent, federation.parent_store
    gate = tmp_path / "release-first"
    first_run = parent.trigger("e2e_job", {"job": a100(2, f"while [ ! -e {gate} ]; do sleep 0.1; done")}, user="alice")
    first = admitted_job_of(parent, first_run)
    _wait(lambda: store.get_job(first).state is JobState.RUNNING, "the first job to run on the peer")
    runs = [parent.trigger("e2e_job", {"job": a100(4, f"sleep 1; echo queued {n}")}, user="alice") for n in range(3)]
    queued = [admitted_job_of(parent, run) for run in runs]
    _wait(lambda: sum(store.get_job(j).handoff_state is HandoffState.HANDED_OFF for j in queued) >= 1, "a handoff")
    heartbeats_after(federation, 3)
    states = [store.get_job(j).handoff_state for j in queued]
    assert sorted(states) == sorted([HandoffState.HANDED_OFF, HandoffState.QUEUED, HandoffState.QUEUED]), states
    handed = next(j for j in queued if store.get_job(j).handoff_state is HandoffState.HANDED_OFF)
    assert federation.peer_store.get_job(on_peer(handed)).state is JobState.PENDING  # queued there, holding nothing
    [backend] = [
        b for p in store.peer_states() if p.peer_id == "cw-east" for b in p.backends if b.backend_id == "one-at-a-time"
    ]
    assert backend.availability.amounts == {"a100": 6}  # what the peer advertises, heartbeat after heartbeat
    waiting = next(j for j in queued if j != handed)
    explained = parent.api("GET", "/iris/federation/ui/api/jobs/explain", params={"job_id": waiting}).json()
    assert "4 a100 reserved for jobs handed off and not yet running there" in explained["summary"], explained
    peers = parent.api("GET", "/iris/federation/ui/api/peers").json()["peers"]
    [shown] = [b for p in peers for b in p["backends"] if b["backend_id"] == "one-at-a-time"]
    assert shown["reserved"] == {"a100": 4} and shown["reserved_jobs"] == [handed]

    gate.touch()  # the first ends; the queued one starts there, and the others follow as room shows
    for run in (first_run, *runs):
        assert parent.wait_for_run("e2e_job", run, timeout=240) == "success"
    assert all(federation.peer_store.get_job(on_peer(j)).backend_id == "one-at-a-time" for j in queued)


def test_nothing_done_to_the_peers_runner_run_ends_the_job_it_mirrors(federation, tmp_path):
    """The runner run is the peer operators' mirror of a job marin owns: clearing its task, marking
    it failed, the peer's scheduler crashing and restarting, and failing the run leave the job
    running; it ends as it would have, and marin's task gets its result."""
    parent, peer = federation.parent, federation.peer
    gate = tmp_path / "go"
    run = parent.trigger(
        "e2e_job", {"job": gpu(f"while [ ! -e {gate} ]; do sleep 0.2; done; echo mirrored")}, user="alice"
    )
    parent.wait_for_task_state("e2e_job", run, "run", ("deferred",))
    job_id = job_of(parent, run)
    _wait(
        lambda: (j := federation.peer_store.get_job(on_peer(job_id))) is not None and j.state is JobState.RUNNING,
        "the job to run on the peer",
    )
    runner = runner_runs(peer, on_peer(job_id))[0]["dag_run_id"]
    peer.wait_for_task_state(RUNNER_DAG_ID, runner, "run", ("deferred",))

    peer.clear_task(RUNNER_DAG_ID, runner, "run")  # a new try watches the same incarnation
    _wait(lambda: peer.task_instance(RUNNER_DAG_ID, runner, "run")["try_number"] == 2, "the runner's next try")
    peer.wait_for_task_state(RUNNER_DAG_ID, runner, "run", ("deferred",))
    peer.set_task_state(RUNNER_DAG_ID, runner, "run", "failed")
    peer.kill_component("scheduler")  # a scheduler failing over
    peer.start_component("scheduler")
    peer.set_run_state(RUNNER_DAG_ID, runner, "failed")
    acted_ms = int(time.time() * 1000)
    peer.wait_for_tick(after_ms=acted_ms)
    parent.wait_for_tick(after_ms=acted_ms)  # marin has synced the job since
    received = federation.peer_store.get_job(on_peer(job_id))
    assert (received.state, received.cancel_intent_version) == (JobState.RUNNING, 0)
    assert federation.parent_store.get_job(job_id).state is JobState.RUNNING

    gate.touch()
    assert parent.wait_for_run("e2e_job", run) == "success"
    assert parent.xcom("e2e_job", run, "run")["state"] == "succeeded"
    received = federation.peer_store.get_job(on_peer(job_id))
    assert (received.state, received.cancel_intent_version) == (JobState.SUCCEEDED, 0)
    assert "cancel_requested" not in [e.kind for e in federation.peer_store.events(on_peer(job_id))]

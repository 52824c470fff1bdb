"""The Airflow surface end to end: real services on PostgreSQL, driven through the REST API.

The parent cluster ``marin`` has a CPU process backend; its peers ``cw-h100`` (8 h100) and
``cw-gb200`` (4 gb200) are process backends driven directly (agentless). Jobs are DAG runs of
``e2e_job`` whose ``conf`` carries the job, triggered as the user ``alice``.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from tests.e2e.jobs import admitted_job_of, job_of
from tests.waiting import wait_for

# Real services take seconds per step: wait longer, and poll less often, than unit tests do.
_wait = partial(wait_for, timeout=90, interval=0.5)

pytestmark = pytest.mark.e2e


def gpu(variant: str, count: int, command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": variant, "count": count}}, **extra}


def test_a_gpu_job_from_conf_is_placed_on_the_peer_with_room_runs_and_fills_xcom(deployment, store):
    run = deployment.trigger("e2e_job", {"job": gpu("gb200", 4, "echo training on $IRIS_DEVICE_SLOTS")}, user="alice")
    assert deployment.wait_for_run("e2e_job", run) == "success"
    result = deployment.xcom("e2e_job", run, "run")
    assert result["job_id"].startswith("/alice/e2e_job.run.")
    assert (result["disposition"], result["peer_id"], result["backend_id"]) == ("queue", "cw-gb200", "default")
    assert (result["state"], result["exit_code"]) == ("succeeded", 0)
    assert result["pending_reasons"][:2] == [reasons.QUEUED_UNPINNED, "Awaiting acceptance by peer cw-gb200"]
    job = store.get_job(result["job_id"])
    assert job.submitting_user == "alice" and job.origin.dag_id == "e2e_job" and job.origin.run_id == run
    kinds = [e.kind for e in store.events(job.job_id)]
    assert kinds[:3] == ["admitted", "promoted", "handed_off"] and kinds.count("promoted") == 1
    assert "Federation page: " in deployment.task_log("e2e_job", run, "run")


def test_a_job_waits_while_the_peers_are_full_and_runs_when_capacity_frees(deployment, store):
    first = deployment.trigger("e2e_job", {"job": gpu("h100", 8, "sleep 8")}, user="alice")
    deployment.wait_for_task_state("e2e_job", first, "run", ("deferred",))
    first_job = job_of(deployment, first)
    _wait(lambda: store.get_job(first_job).state is JobState.RUNNING, "the first job to run")
    second = deployment.trigger("e2e_job", {"job": gpu("h100", 8, "echo second")}, user="alice")
    deployment.wait_for_task_state("e2e_job", second, "run", ("deferred",))
    second_job = job_of(deployment, second)
    time.sleep(4)  # several ticks: the second job must still be queued while the first holds the peer
    waiting = store.get_job(second_job)
    assert waiting.handoff_state is HandoffState.QUEUED
    assert waiting.pending_reason == reasons.QUEUED_UNPINNED
    assert deployment.wait_for_run("e2e_job", second, timeout=120) == "success"
    assert deployment.wait_for_run("e2e_job", first) == "success"
    assert reasons.QUEUED_UNPINNED in deployment.task_log("e2e_job", second, "run")
    assert store.get_job(second_job).started_at_ms >= store.get_job(first_job).finished_at_ms


def test_an_unschedulable_job_fails_fast_with_the_reason(deployment, store):
    before = len(store.list_jobs(limit=10_000))
    run = deployment.trigger(
        "e2e_job",
        {"job": {"command": "true", "resources": {"device": {"type": "tpu", "variant": "v5p-8", "count": 4}}}},
        user="alice",
    )
    assert deployment.wait_for_run("e2e_job", run, timeout=60) == "failed"
    log = deployment.task_log("e2e_job", run, "run")
    assert "is unschedulable: no local backend or peer can host it" in log
    assert "needs device-type EQ tpu" in log
    assert deployment.task_instance("e2e_job", run, "run")["try_number"] == 1
    assert len(store.list_jobs(limit=10_000)) == before


def test_a_pinned_job_lands_on_its_pin(deployment, store):
    # Both peers could run a CPU job (and so could this cluster): the pin decides.
    run = deployment.trigger("e2e_job", {"job": {"command": "echo pinned", "target_cluster": "cw-h100"}}, user="alice")
    assert deployment.wait_for_run("e2e_job", run) == "success"
    result = deployment.xcom("e2e_job", run, "run")
    assert result["peer_id"] == "cw-h100" and result["state"] == "succeeded"
    assert store.get_job(result["job_id"]).direction.value == "sent"


def test_failing_the_dag_run_while_queued_cancels_the_job_before_handoff(deployment, store):
    # cw-gb200's 4 gb200 are taken by a production job; a job pinned there can only wait. (A job
    # needing more than the peer has in total is refused at submit instead: it could never run.)
    blocker_run = deployment.trigger(
        "e2e_job", {"job": gpu("gb200", 4, "sleep 600", priority_band="production")}, user="alice"
    )
    blocker = admitted_job_of(deployment, blocker_run)
    _wait(lambda: store.get_job(blocker).state is JobState.RUNNING, "the blocker to run on cw-gb200")
    run = deployment.trigger("e2e_job", {"job": gpu("gb200", 4, "echo never", target_cluster="cw-gb200")}, user="alice")
    deployment.wait_for_task_state("e2e_job", run, "run", ("deferred",))
    job_id = job_of(deployment, run)
    assert store.get_job(job_id).pending_reason == "Queued for peer cw-gb200 to report free capacity"
    deployment.set_run_state("e2e_job", run, "failed")
    deployment.set_run_state("e2e_job", blocker_run, "failed")  # the blocker goes too (the tick cancels it)
    _wait(lambda: store.get_job(job_id).terminal, "the cancel to reach the store")
    job = store.get_job(job_id)
    assert (job.state, job.error, job.handoff_state) == (
        JobState.KILLED,
        reasons.CANCELLED_BEFORE_HANDOFF,
        HandoffState.QUEUED,
    )
    time.sleep(3)
    assert "promoted" not in [e.kind for e in store.events(job_id)]
    assert not list((deployment.home / "iris" / "cw-gb200" / "default" / "jobs").glob("alice__*never*"))
    _wait(lambda: store.get_job(blocker).terminal, "the blocker to be cancelled", timeout=120)


def test_a_malformed_conf_fails_the_task_naming_the_field_and_writes_nothing(deployment, store):
    before = len(store.list_jobs(limit=10_000))
    run = deployment.trigger(
        "e2e_job",
        {
            "job": {
                "command": "true",
                "resources": {"device": {"type": "gpu", "variant": "h100", "count": 0}},
                "priority_band": "urgent",
            }
        },
        user="alice",
    )
    assert deployment.wait_for_run("e2e_job", run, timeout=60) == "failed"
    log = deployment.task_log("e2e_job", run, "run")
    assert "job.resources.device.count: must be >= 1 for a gpu device" in log
    assert "job.priority_band: unknown priority band 'urgent'" in log
    assert deployment.task_instance("e2e_job", run, "run")["try_number"] == 1
    assert len(store.list_jobs(limit=10_000)) == before


def test_a_job_that_fits_here_runs_locally(deployment, store):
    run = deployment.trigger("e2e_job", {"job": {"command": "echo local; exit 0"}}, user="alice")
    assert deployment.wait_for_run("e2e_job", run) == "success"
    result = deployment.xcom("e2e_job", run, "run")
    assert (result["disposition"], result["peer_id"], result["backend_id"]) == ("local", "", "cpu")


def test_a_workdir_next_to_the_dag_travels_with_the_job_to_the_peer(deployment, store):
    run = deployment.trigger("e2e_workdir", {"job": gpu("gb200", 1, "sh train.sh")}, user="alice")
    assert deployment.wait_for_run("e2e_workdir", run) == "success"
    result = deployment.xcom("e2e_workdir", run, "run")
    assert (result["peer_id"], result["exit_code"]) == ("cw-gb200", 0)
    assert sorted(store.get_job(result["job_id"]).spec["files"]) == ["config/params.txt", "train.sh"]
    assert "training with lr=0.1" in deployment.task_log("e2e_workdir", run, "run")  # its output, relayed


def test_a_job_failing_on_the_peer_fails_the_task_with_its_exit_code(deployment, store):
    run = deployment.trigger("e2e_job", {"job": gpu("gb200", 1, "echo bad; exit 7")}, user="alice")
    assert deployment.wait_for_run("e2e_job", run) == "failed"
    log = deployment.task_log("e2e_job", run, "run")
    assert "is failed on peer cw-gb200" in log and "Replica 0 exited with code 7" in log
    assert "Failed: replica 0 (exit code 7)." in log  # the replica, as the peer reported it


def test_the_sensor_waits_for_a_job_and_succeeds_with_it(deployment, store):
    run = deployment.trigger("e2e_job", {"job": gpu("gb200", 1, "sleep 3")}, user="alice")
    deployment.wait_for_task_state("e2e_job", run, "run", ("deferred",))
    job_id = job_of(deployment, run)
    watch = deployment.trigger("e2e_sensor", {"job_id": job_id}, user="alice")
    deployment.wait_for_task_state("e2e_sensor", watch, "wait", ("deferred", "success"))
    assert deployment.wait_for_run("e2e_sensor", watch) == "success"
    assert store.get_job(job_id).state is JobState.SUCCEEDED


def test_execution_timeout_holds_while_deferred_and_cancels_the_job(deployment, store):
    run = deployment.trigger("e2e_timeout", {"job": gpu("gb200", 1, "sleep 120")}, user="alice")
    assert deployment.wait_for_run("e2e_timeout", run, timeout=120) == "failed"
    job_id = job_of(deployment, run, "e2e_timeout")
    _wait(lambda: store.get_job(job_id).state is JobState.KILLED, "the timed-out job to be killed", timeout=60)
    assert "Timed out waiting for job" in deployment.task_log("e2e_timeout", run, "run")


def test_an_explicit_submitter_is_accepted_only_for_the_dags_the_cluster_file_allows(deployment, store):
    allowed = deployment.trigger("e2e_service_job", user="bob")
    assert deployment.wait_for_run("e2e_service_job", allowed) == "success"
    job = store.get_job(job_of(deployment, allowed, "e2e_service_job"))
    assert job.submitting_user == "ml-platform@example.com" and job.job_id.startswith("/ml-platform@example.com/")

    refused = deployment.trigger("e2e_unlisted_principal", user="bob")
    assert deployment.wait_for_run("e2e_unlisted_principal", refused) == "failed"
    log = deployment.task_log("e2e_unlisted_principal", refused, "run")
    assert "submitter 'ml-platform@example.com' is not allowed for DAG 'e2e_unlisted_principal'" in log
    assert [j for j in store.list_jobs(limit=1000) if j.origin and j.origin.dag_id == "e2e_unlisted_principal"] == []


def test_an_agentless_peer_admits_only_its_allowed_submitters(deployment, store):
    run = deployment.trigger("e2e_job", {"job": gpu("gb200", 1, "echo never")}, user="admin")
    assert deployment.wait_for_run("e2e_job", run) == "failed"
    job = store.get_job(job_of(deployment, run))
    assert (job.state, job.handoff_state) == (JobState.KILLED, HandoffState.REJECTED)
    assert job.error == (
        "Peer cw-gb200 rejected the handoff: Submitter 'admin' is not admitted for federation to this cluster "
        "(allowed_submitters of peer cw-gb200 in the cluster file)"
    )

"""The operator's wait wakes its task when the peer running a handed-off job reported its serving URLs
for the incarnation running now, once per incarnation: the task logs and pushes them, and waits again
from where its task log got to."""

from __future__ import annotations

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.triggers.federation import FederationJobTrigger
from tests.triggers.conftest import hand_off, now_ms, promote, queue_job, report, stays_false
from tests.triggers.test_trigger import JOB, logged, until_logged, wait_on

URLS = {"http": "https://iris.example.com/proxy/t/cluster=cw-h100/eyJ.eyJ.sig/http/"}


def running_job(store):
    job = queue_job(store, JOB)
    promote(store, JOB)
    hand_off(store, JOB)
    report(store, JOB, JobState.RUNNING)
    return job


async def test_the_urls_of_the_running_incarnation_wake_the_task_once(store, caplog):
    job = running_job(store)
    waiting = wait_on(announce_serving=True)
    await until_logged(caplog, f"Job {JOB} is running")
    assert not waiting.fired
    store.append_logs(JOB, job.nonce, ["[replica 0] listening"], "c1", now_ms())
    await until_logged(caplog, "listening")
    report(store, JOB, JobState.RUNNING, serving_urls=URLS)
    event = await waiting.event()
    assert (event["status"], event["nonce"], event["announced"], event["state"]) == (
        "serving",
        job.nonce,
        "",
        "running",
    )
    assert event["log_seq"] > 0
    # The task announced them and waits again: not woken for the same incarnation, nor is the output
    # already in its task log relayed twice.
    caplog.clear()
    again = wait_on(announce_serving=True, serving_announced=job.nonce, log_after_seq=event["log_seq"])
    await until_logged(caplog, f"Job {JOB} is running")
    store.append_logs(JOB, job.nonce, ["[replica 0] serving"], "c2", now_ms())
    await until_logged(caplog, "serving")
    await stays_false(lambda: again.fired, 0.3)
    assert not any("listening" in line for line in logged(caplog))
    report(store, JOB, JobState.SUCCEEDED, exit_code=0)
    assert (await again.event())["status"] == "reached"


async def test_the_sensors_wait_is_not_woken_by_them(store):
    """The sensor's wait (announce_serving off, as every wait deferred before it existed) is about
    the job's state alone."""
    running_job(store)
    report(store, JOB, JobState.RUNNING, serving_urls=URLS)
    waiting = wait_on()
    await stays_false(lambda: waiting.fired, 0.3)
    report(store, JOB, JobState.SUCCEEDED, exit_code=0)
    assert (await waiting.event())["status"] == "reached"


async def test_a_wait_for_running_ends_on_the_state_not_on_the_urls(store):
    running_job(store)
    report(store, JOB, JobState.RUNNING, serving_urls=URLS)
    assert (await wait_on(announce_serving=True, until="running").event())["status"] == "reached"


def test_the_serving_state_of_a_wait_survives_its_serialization():
    trigger = FederationJobTrigger(JOB, announce_serving=True, serving_announced="n1", log_after_seq=42)
    _, kwargs = trigger.serialize()
    rebuilt = FederationJobTrigger(**kwargs)
    assert (rebuilt.announce_serving, rebuilt.serving_announced, rebuilt.log_after_seq) == (True, "n1", 42)
    # A wait deferred before this existed announces nothing.
    assert FederationJobTrigger(JOB).announce_serving is False

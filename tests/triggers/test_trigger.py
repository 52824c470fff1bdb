"""The triggers on a real SQLite store: ``FederationJobTrigger`` (the operator's and the sensor's wait)
and ``FederationWakeTrigger`` (wakes the placement DAG). No Airflow services: the triggers run on the
test's event loop, consumed as the triggerer does (``async for event in trigger.run()``), while the
test writes the store with the synchronous ``FederationStore``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import pytest
from airflow.sdk.module_loading import import_string

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.orphans import TASK_KILLED, KillAction
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.async_store import AsyncFederationStore
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.triggers.federation import FederationJobTrigger
from iris_airflow_provider.triggers.poller import LogLines, SharedJobPoller
from iris_airflow_provider.triggers.wake import FederationWakeTrigger
from tests.triggers.conftest import (
    INTERVAL,
    PEER,
    hand_off,
    now_ms,
    promote,
    queue_job,
    report,
    route_log_to_stdlib,
    stays_false,
)
from tests.waiting import eventually

JOB = "/alice/train"
TRIGGER_LOGGER = "iris_airflow_provider.triggers.federation.FederationJobTrigger"


class Waiting:
    """A trigger running as the triggerer runs it, in its own task; collects what it yields."""

    def __init__(self, trigger: Any) -> None:
        self.trigger = trigger
        self.events: list[dict[str, Any]] = []
        self.task = asyncio.get_running_loop().create_task(self._consume())

    async def _consume(self) -> None:
        async for event in self.trigger.run():
            self.events.append(event.payload)

    async def event(self, timeout: float = 5.0) -> dict[str, Any]:
        await asyncio.wait_for(asyncio.shield(self.task), timeout)
        assert len(self.events) == 1, self.events  # one event, then the generator ends
        return self.events[0]

    @property
    def fired(self) -> bool:
        return self.task.done()

    async def cancel(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def wait_on(job_id: str = JOB, **kwargs: Any) -> Waiting:
    trigger = FederationJobTrigger(job_id, poll_interval=INTERVAL, **kwargs)
    route_log_to_stdlib(trigger)
    return Waiting(trigger)


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == TRIGGER_LOGGER]


async def until_logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    await eventually(lambda: any(text in line for line in logged(caplog)), what=f"a log line with {text!r}")


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


def test_serialize_round_trips_through_the_classpath():
    trigger = FederationJobTrigger(
        JOB,
        until="running",
        conn_id="iris_other",
        poll_interval=7,
        deadline_ms=1_800_000_000_000,
        kill_action=KillAction.CHECK,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "iris_airflow_provider.triggers.federation.FederationJobTrigger"
    rebuilt = import_string(classpath)(**kwargs)
    assert type(rebuilt) is FederationJobTrigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert (rebuilt.job_id, rebuilt.until, rebuilt.conn_id, rebuilt.poll_interval) == (
        JOB,
        "running",
        "iris_other",
        7.0,
    )
    assert (rebuilt.deadline_ms, rebuilt.kill_action) == (1_800_000_000_000, KillAction.CHECK)
    assert kwargs["kill_action"] == "check"


@pytest.mark.parametrize(("old", "action"), [(True, KillAction.CHECK), (False, KillAction.IGNORE)])
def test_a_wait_deferred_by_an_earlier_version_keeps_its_meaning(old, action):
    """``cancel_on_kill=True`` was the operator's wait (now: the tick checks), False the sensor's."""
    assert FederationJobTrigger(JOB, cancel_on_kill=old).kill_action is action


def test_an_unknown_until_is_refused():
    with pytest.raises(ValueError, match="until must be one of accepted, running, completion"):
        FederationJobTrigger(JOB, until="started")


class TestFiresWhenTheJobGotFarEnough:
    async def test_until_accepted_fires_once_the_peer_admitted_the_job(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on(until="accepted")
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        promote(store, JOB)
        await until_logged(caplog, reasons.awaiting_acceptance(PEER))
        await stays_false(lambda: waiting.fired, 5 * INTERVAL)  # promoted is not accepted yet
        hand_off(store, JOB)
        event = await waiting.event()
        assert event["status"] == "reached" and event["until"] == "accepted"
        assert (event["state"], event["handoff_state"], event["peer_id"]) == ("pending", "handed_off", PEER)
        assert event["pending_reasons"] == [
            reasons.QUEUED_UNPINNED,
            reasons.awaiting_acceptance(PEER),
            reasons.awaiting_first_report(PEER),
        ]

    async def test_until_running_waits_past_acceptance(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on(until="running")
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        promote(store, JOB)
        hand_off(store, JOB)
        await until_logged(caplog, reasons.awaiting_first_report(PEER))
        report(store, JOB, JobState.PENDING)
        await until_logged(caplog, reasons.pending_on_peer(PEER))
        await stays_false(lambda: waiting.fired, 5 * INTERVAL)
        report(store, JOB, JobState.RUNNING)
        event = await waiting.event()
        assert (event["status"], event["state"], event["until"]) == ("reached", "running", "running")

    async def test_until_completion_waits_for_the_end_and_reports_it(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on()
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        promote(store, JOB)
        hand_off(store, JOB)
        report(store, JOB, JobState.RUNNING)
        await until_logged(caplog, "is running")
        await stays_false(lambda: waiting.fired, 5 * INTERVAL)
        report(store, JOB, JobState.FAILED, error="exit status 7", exit_code=7)
        event = await waiting.event()
        assert (event["status"], event["state"], event["exit_code"], event["error"]) == (
            "reached",
            "failed",
            7,
            "exit status 7",
        )
        assert event["message"] == f"Job {JOB} is failed on peer {PEER} (handoff handed_off): exit status 7"

    async def test_a_job_already_finished_fires_at_once(self, store):
        queue_job(store, JOB)
        store.request_cancel(JOB, now_ms())
        event = await wait_on(until="accepted").event(timeout=2)
        assert (event["status"], event["state"], event["error"]) == (
            "reached",
            "killed",
            reasons.CANCELLED_BEFORE_HANDOFF,
        )


async def test_every_change_of_state_and_pending_reason_is_logged_once_in_the_seeds_words(store, caplog):
    queue_job(store, JOB)
    waiting = wait_on()
    await until_logged(caplog, reasons.QUEUED_UNPINNED)
    promote(store, JOB)
    await until_logged(caplog, reasons.awaiting_acceptance(PEER))
    job = store.get_job(JOB)
    # A write that changes nothing a waiting task cares about (a failed delivery, retried later) logs nothing.
    store.defer_delivery(JOB, job.nonce, "connection refused", now_ms() + 60_000, now_ms())
    hand_off(store, JOB)
    await until_logged(caplog, reasons.awaiting_first_report(PEER))
    report(store, JOB, JobState.PENDING)
    await until_logged(caplog, reasons.pending_on_peer(PEER))
    report(store, JOB, JobState.RUNNING)
    await until_logged(caplog, "is running")
    report(store, JOB, JobState.SUCCEEDED, exit_code=0)
    event = await waiting.event()
    assert logged(caplog) == [
        f"Job {JOB} is pending (handoff queued): Queued for a federation peer to report free capacity",
        f"Job {JOB} is pending on peer {PEER} (handoff pending): Awaiting acceptance by peer {PEER}",
        f"Job {JOB} is pending on peer {PEER} (handoff handed_off): "
        f"Handed off to peer {PEER}; awaiting first status report",
        f"Job {JOB} is pending on peer {PEER} (handoff handed_off): Pending on peer {PEER}",
        f"Job {JOB} is running on peer {PEER} (handoff handed_off)",
        f"Job {JOB} is succeeded on peer {PEER} (handoff handed_off)",
    ]
    assert event["pending_reasons"] == [
        "Queued for a federation peer to report free capacity",
        f"Awaiting acceptance by peer {PEER}",
        f"Handed off to peer {PEER}; awaiting first status report",
        f"Pending on peer {PEER}",
    ]


async def test_a_pinned_job_waits_for_its_peer_in_the_seeds_words(store, caplog):
    queue_job(store, JOB, pin="cw-gb200")
    waiting = wait_on()
    await until_logged(caplog, "Queued for peer cw-gb200 to report free capacity")
    await waiting.cancel()


class TestDeadline:
    async def test_the_deadline_fires_a_timeout_event_with_what_the_job_was_doing(self, store):
        queue_job(store, JOB)
        started = time.monotonic()
        event = await wait_on(deadline_ms=now_ms() + 300).event()
        assert time.monotonic() - started >= 0.25
        assert event["status"] == "timeout"
        assert event["state"] == "pending" and event["handoff_state"] == "queued"
        assert event["message"] == (
            f"the deadline passed while Job {JOB} is pending (handoff queued): {reasons.QUEUED_UNPINNED}"
        )
        assert event["pending_reasons"] == [reasons.QUEUED_UNPINNED]
        assert store.get_job(JOB).state is JobState.PENDING  # the operator cancels on this event, not the trigger

    async def test_a_deadline_already_past_times_out_at_once(self, store):
        queue_job(store, JOB)
        event = await wait_on(deadline_ms=now_ms() - 1).event(timeout=2)
        assert event["status"] == "timeout"
        assert event["message"] == "the deadline passed while waiting"


async def test_a_job_missing_from_the_store_fires_a_missing_event(store):
    event = await wait_on("/alice/nothing-here").event()
    assert event["status"] == "missing"
    assert event["message"] == "Job /alice/nothing-here is not in the federation store"
    assert "state" not in event


class TestKill:
    """What the triggerer does when a user acts on the deferred task (mark failed or success, clear):
    cancel the trigger's task, then ``on_kill()``. What happens to the job is the ``kill_action``."""

    async def test_by_default_for_the_operator_the_job_is_left_and_the_tick_asked_to_check(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on(kill_action=KillAction.CHECK)
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        await waiting.cancel()
        await waiting.trigger.on_kill()
        job = store.get_job(JOB)
        assert (job.state, job.handoff_state, job.cancel_intent_version) == (JobState.PENDING, HandoffState.QUEUED, 0)
        killed = [e for e in store.events(JOB) if e.kind == TASK_KILLED]
        assert len(killed) == 1 and "the placement tick cancels the job" in killed[0].detail
        assert any(f"job {JOB} keeps running" in line for line in logged(caplog))

    async def test_with_cancel_on_kill_it_cancels_a_queued_job_before_handoff(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on(kill_action=KillAction.CANCEL)
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        await waiting.cancel()
        await waiting.trigger.on_kill()
        job = store.get_job(JOB)
        assert (job.state, job.error, job.cancel_intent_version) == (
            JobState.KILLED,
            reasons.CANCELLED_BEFORE_HANDOFF,
            1,
        )
        assert any(f"so job {JOB} is cancelled (cancel_on_kill=True)" in line for line in logged(caplog))

    async def test_a_job_that_already_ended_is_left_as_it_is(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on(kill_action=KillAction.CHECK)
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        store.request_cancel(JOB, now_ms())  # e.g. the tick's check got there first
        await waiting.cancel()
        await waiting.trigger.on_kill()
        assert TASK_KILLED not in [e.kind for e in store.events(JOB)]
        assert any("has already ended or is being cancelled" in line for line in logged(caplog))

    async def test_a_watcher_or_a_mirror_leaves_the_job_alone(self, store, caplog):
        queue_job(store, JOB)
        waiting = wait_on()  # the sensor's and the peer's runner DAG's: they only watch
        assert waiting.trigger.kill_action is KillAction.IGNORE
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        await waiting.cancel()
        await waiting.trigger.on_kill()
        job = store.get_job(JOB)
        assert (job.state, job.handoff_state, job.cancel_intent_version) == (JobState.PENDING, HandoffState.QUEUED, 0)
        assert TASK_KILLED not in [e.kind for e in store.events(JOB)]

    async def test_a_cancelled_wait_without_on_kill_leaves_the_job_and_releases_the_poller(self, store, caplog):
        """A triggerer restart cancels every trigger without calling on_kill: nothing is cancelled."""
        queue_job(store, JOB)
        waiting = wait_on()
        await until_logged(caplog, reasons.QUEUED_UNPINNED)
        await waiting.cancel()
        assert store.get_job(JOB).cancel_intent_version == 0
        assert SharedJobPoller._pollers == {}


# The wake trigger ----------------------------------------------------------------------------------


class WakeEvents:
    """``FederationWakeTrigger.run()`` consumed in a task, each event with its arrival time."""

    def __init__(self, trigger: FederationWakeTrigger) -> None:
        self.trigger = trigger
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.task = asyncio.get_running_loop().create_task(self._consume())

    async def _consume(self) -> None:
        async for event in self.trigger.run():
            self.events.append((time.monotonic(), event.payload))

    def reasons(self) -> list[str]:
        return [payload["reason"] for _, payload in self.events]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def start_wake(store, monkeypatch):
    """Starts a wake trigger (polls every 50 ms, wakes every 0.3 s while jobs are in flight) and
    returns once it has read where the store's history stands."""
    probes: list[int] = []
    original = AsyncFederationStore.latest_event_seq

    async def counting(self, kinds):
        seq = await original(self, kinds)
        probes.append(seq)
        return seq

    monkeypatch.setattr(AsyncFederationStore, "latest_event_seq", counting)
    started: list[WakeEvents] = []

    async def start() -> WakeEvents:
        trigger = FederationWakeTrigger(poll_interval=INTERVAL, sync_interval=0.3)
        route_log_to_stdlib(trigger)
        started.append(WakeEvents(trigger))
        await eventually(lambda: probes, what="the wake trigger to read the history")
        return started[-1]

    yield start
    for events in started:
        await events.stop()


class TestWakeTrigger:
    def test_serialize_round_trips_through_the_classpath(self):
        trigger = FederationWakeTrigger(conn_id="iris_other", poll_interval=2, sync_interval=15)
        classpath, kwargs = trigger.serialize()
        assert classpath == "iris_airflow_provider.triggers.wake.FederationWakeTrigger"
        assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)
        assert kwargs == {"conn_id": "iris_other", "poll_interval": 2.0, "sync_interval": 15.0}

    async def test_idle_it_wakes_nothing(self, store, start_wake):
        queue_job(store, "/alice/old")  # queued before it started, and not in flight: no news
        wake = await start_wake()
        await stays_false(lambda: wake.events, 1.0)  # 20 polls

    async def test_an_admitted_job_wakes_it(self, store, start_wake):
        wake = await start_wake()
        await stays_false(lambda: wake.events, 0.3)
        queue_job(store, JOB)
        await eventually(lambda: wake.events, timeout=2, what="a wake")
        assert wake.reasons() == ["a job was queued, resubmitted or cancelled, or its task was killed"]
        payload = wake.events[0][1]
        assert payload["event_seq"] == store.events(JOB)[-1].seq
        assert abs(payload["at_ms"] - now_ms()) < 5_000
        await stays_false(lambda: len(wake.events) > 1, 0.5)  # once per admission, not once per poll

    async def test_a_killed_task_wakes_it_so_the_tick_checks_its_state(self, store, start_wake):
        wake = await start_wake()
        queue_job(store, JOB)
        await eventually(lambda: wake.events, timeout=2, what="the admission's wake")
        store.record_event(JOB, TASK_KILLED, now_ms(), "killed")
        await eventually(lambda: len(wake.events) == 2, timeout=2, what="the kill's wake")
        assert wake.reasons()[1] == "a job was queued, resubmitted or cancelled, or its task was killed"

    async def test_a_cancel_request_wakes_it(self, store, start_wake):
        wake = await start_wake()
        queue_job(store, JOB)
        await eventually(lambda: wake.events, timeout=2, what="the admission's wake")
        store.request_cancel(JOB, now_ms())
        await eventually(lambda: len(wake.events) == 2, timeout=2, what="the cancel's wake")
        assert wake.reasons()[1] == "a job was queued, resubmitted or cancelled, or its task was killed"
        await stays_false(lambda: len(wake.events) > 2, 0.5)  # the job ended before handoff: nothing in flight

    async def test_while_jobs_are_in_flight_it_wakes_every_sync_interval(self, store, start_wake):
        wake = await start_wake()
        queue_job(store, JOB)
        promote(store, JOB)  # a pending handoff is in flight until it ends
        await eventually(lambda: len(wake.events) >= 4, timeout=5, what="periodic wakes")
        in_flight = [at for at, payload in wake.events if payload["reason"] == "jobs are in flight"]
        assert len(in_flight) >= 3
        gaps = [later - earlier for earlier, later in itertools.pairwise(in_flight)]
        assert all(0.25 <= gap <= 1.0 for gap in gaps), gaps
        report(store, JOB, JobState.SUCCEEDED, exit_code=0)
        await asyncio.sleep(0.4)
        count = len(wake.events)
        await stays_false(lambda: len(wake.events) > count, 1.0)  # done: idle again


async def test_the_jobs_output_is_relayed_into_the_task_log_new_lines_only_and_all_of_it_at_the_end(store, caplog):
    earlier = queue_job(store, JOB)
    # An earlier run of the same job id left output behind: it is never relayed for this one.
    assert store.append_logs(JOB, earlier.nonce, ["stale output of the earlier run"], "c0", now_ms())
    store.transition(JOB, to_state=JobState.FAILED, now_ms=now_ms())
    job = store.reincarnate(
        NewIncarnation(earlier.job_spec, direction=earlier.direction, submitting_user="alice@example.com"),
        now_ms=now_ms(),
    )
    assert job is not None
    waiting = wait_on()
    promote(store, JOB)
    hand_off(store, JOB)
    report(store, JOB, JobState.RUNNING)
    store.append_logs(JOB, job.nonce, ["[replica 0] step 1", "[replica 0] step 2"], "c1", now_ms())
    await until_logged(caplog, "step 2")
    store.append_logs(JOB, job.nonce, ["[replica 0] step 3"], "c2", now_ms())
    await until_logged(caplog, "step 3")
    # The last lines land together with the end (as a tick writes them): the wait still relays them.
    store.append_logs(JOB, job.nonce, ["[replica 0] done"], "c3", now_ms())
    report(store, JOB, JobState.SUCCEEDED, exit_code=0)
    await waiting.event()
    output = [line for line in logged(caplog) if line.startswith(f"[peer {PEER}]")]
    assert output == [
        f"[peer {PEER}] [replica 0] step 1",
        f"[peer {PEER}] [replica 0] step 2",
        f"[peer {PEER}] [replica 0] step 3",
        f"[peer {PEER}] [replica 0] done",
    ]


async def test_a_second_waiter_on_a_job_is_told_which_output_was_handed_over_already(store, caplog):
    job = queue_job(store, JOB)
    first = wait_on()
    promote(store, JOB)
    hand_off(store, JOB)
    report(store, JOB, JobState.RUNNING)
    store.append_logs(JOB, job.nonce, ["[replica 0] step 1"], "c1", now_ms())
    await until_logged(caplog, "step 1")
    # Another wait on the same job (a sensor, say) shares the poller: without this it would think
    # that output still to come and, once the job ends, sit out its grace period for nothing.
    [poller] = SharedJobPoller._pollers.values()
    queue = poller.subscribe(JOB)
    snapshot, handed_over = queue.get_nowait(), queue.get_nowait()
    assert handed_over == LogLines(JOB, (), snapshot.last_log_seq) and snapshot.last_log_seq > 0
    await poller.unsubscribe(JOB, queue)
    report(store, JOB, JobState.SUCCEEDED, exit_code=0)
    assert (await first.event())["state"] == "succeeded"

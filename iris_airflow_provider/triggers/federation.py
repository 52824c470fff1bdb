"""The trigger behind the operator and the sensor: waits on a federated job in the triggerer.

It watches the job through the process's shared poller (no worker slot, no blocking driver, one
query per interval for all waits), logs every change of state and pending reason into the task
log, and fires once the job reached what the task waits for: acceptance by a peer, running, or
the end. What a user killing the deferred task does to the job is the waiting task's
``kill_action``: by default the placement tick checks the task's state at once and cancels the job
only if the task has failed; a triggerer restart does nothing at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from iris_airflow_provider.core.orphans import TASK_KILLED, KillAction, kill_message
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.hooks.federation_store import FederationStoreHook
from iris_airflow_provider.store.async_store import AsyncFederationStore, JobSnapshot
from iris_airflow_provider.triggers.poller import LogLines, Message, SharedJobPoller

WAIT_UNTIL = ("accepted", "running", "completion")
DEFAULT_POLL_INTERVAL = 5.0
LOG_LINES_PER_MESSAGE = 500  # lines relayed into the task log per poll, per wait
LOG_FLUSH_INTERVALS = 3  # polls a finished job waits for output the store already holds


def reached(snapshot: JobSnapshot, until: str) -> bool:
    """Whether the job got as far as ``until`` (a finished job has gone as far as it ever will)."""
    if snapshot.terminal:
        return True
    if until == "running":
        return snapshot.state is JobState.RUNNING
    if until == "accepted":
        handed_off = snapshot.direction is Direction.SENT and snapshot.handoff_state is HandoffState.HANDED_OFF
        return handed_off or snapshot.state in (JobState.ACCEPTED, JobState.RUNNING)
    return False


def describe(snapshot: JobSnapshot) -> str:
    where = f" on peer {snapshot.peer_id}" if snapshot.direction is Direction.SENT and snapshot.peer_id else ""
    if snapshot.direction is Direction.LOCAL and snapshot.backend_id:
        where = f" on local backend {snapshot.backend_id}"
    text = f"Job {snapshot.job_id} is {snapshot.state.value}{where}"
    if snapshot.handoff_state is not None:
        text += f" (handoff {snapshot.handoff_state.value})"
    if snapshot.pending_reason:
        text += f": {snapshot.pending_reason}"
    if snapshot.terminal and snapshot.error:
        text += f": {snapshot.error}"
    return text


class FederationJobTrigger(BaseTrigger):
    def __init__(
        self,
        job_id: str,
        *,
        until: str = "completion",
        conn_id: str = FederationStoreHook.default_conn_name,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        deadline_ms: int | None = None,
        kill_action: KillAction | str = KillAction.IGNORE,
        cancel_on_kill: bool | None = None,  # how waits deferred by an earlier version said it
        announce_serving: bool = False,
        serving_announced: str = "",
        log_after_seq: int = 0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger is untyped
        if until not in WAIT_UNTIL:
            raise ValueError(f"until must be one of {', '.join(WAIT_UNTIL)}, got {until!r}")
        self.job_id = job_id
        self.until = until
        self.conn_id = conn_id
        self.poll_interval = float(poll_interval)
        self.deadline_ms = deadline_ms
        if cancel_on_kill is not None:  # True was the operator's wait, False the sensor's
            kill_action = KillAction.CHECK if cancel_on_kill else KillAction.IGNORE
        self.kill_action = KillAction(kill_action)
        # Fire a "serving" event when a handed-off job's peer reported serving URLs for an incarnation
        # other than ``serving_announced`` (the nonce the task already logged and pushed them for).
        self.announce_serving = announce_serving
        self.serving_announced = serving_announced
        self.log_after_seq = log_after_seq  # the job's output up to here is in the task log already

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "until": self.until,
                "conn_id": self.conn_id,
                "poll_interval": self.poll_interval,
                "deadline_ms": self.deadline_ms,
                "kill_action": self.kill_action.value,
                "announce_serving": self.announce_serving,
                "serving_announced": self.serving_announced,
                "log_after_seq": self.log_after_seq,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        url = await FederationStoreHook(self.conn_id).aget_url()
        poller = SharedJobPoller.for_store(url, self.poll_interval)
        queue = poller.subscribe(self.job_id, after_seq=self.log_after_seq)
        reasons: list[str] = []
        try:
            event = await self._wait(queue, reasons)
        finally:
            await poller.unsubscribe(self.job_id, queue)
        # Yield last, after the poller released its connections: the task resumes on this event.
        yield TriggerEvent(event)

    async def _wait(self, queue: asyncio.Queue[Message], reasons: list[str]) -> dict[str, Any]:
        last: JobSnapshot | None = None
        relayed_to = self.log_after_seq  # the job's output has been written to the task log up to this line
        finished_at: float | None = None  # when the job got as far as we wait for
        while True:
            timeout = None
            if self.deadline_ms is not None:
                timeout = (self.deadline_ms - time.time() * 1000) / 1000
                if timeout <= 0:
                    return self._event(
                        "timeout", last, reasons, f"the deadline passed while {describe(last) if last else 'waiting'}"
                    )
            if finished_at is not None:
                # Done, but output the store already holds has not come through yet: wait a little.
                grace = finished_at + LOG_FLUSH_INTERVALS * self.poll_interval - time.monotonic()
                if last is None or relayed_to >= last.last_log_seq or grace <= 0:
                    assert last is not None
                    return self._event("reached", last, reasons, describe(last))
                timeout = grace if timeout is None else min(timeout, grace)
            try:
                message = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                continue
            if message is None:
                return self._event("missing", last, reasons, f"Job {self.job_id} is not in the federation store")
            if isinstance(message, LogLines):
                self._relay(message, last)
                relayed_to = max(relayed_to, message.up_to_seq)
                continue
            snapshot = message
            if last is None or (snapshot.state, snapshot.handoff_state, snapshot.pending_reason, snapshot.peer_id) != (
                last.state,
                last.handoff_state,
                last.pending_reason,
                last.peer_id,
            ):
                self.log.info(describe(snapshot))
            if snapshot.pending_reason and (not reasons or reasons[-1] != snapshot.pending_reason):
                reasons.append(snapshot.pending_reason)
            last = snapshot
            if finished_at is None and reached(snapshot, self.until):
                finished_at = time.monotonic()
            if finished_at is None and self._serving_news(snapshot):
                event = self._event("serving", snapshot, reasons, f"Job {self.job_id} serves its ports")
                return {**event, "nonce": snapshot.nonce, "announced": self.serving_announced, "log_seq": relayed_to}

    def _serving_news(self, snapshot: JobSnapshot) -> bool:
        """Whether the task has yet to announce the serving URLs of the job's incarnation running now."""
        return (
            self.announce_serving
            and snapshot.serving_reported
            and not snapshot.terminal
            and snapshot.nonce != self.serving_announced
        )

    def _relay(self, output: LogLines, snapshot: JobSnapshot | None) -> None:
        """The job's own output, into the task log: new lines only, at most a bounded number per poll."""
        where = "here"
        if snapshot is not None and snapshot.direction is Direction.SENT and snapshot.peer_id:
            where = f"peer {snapshot.peer_id}"
        for line in output.lines[:LOG_LINES_PER_MESSAGE]:
            self.log.info("[%s] %s", where, line)
        if len(output.lines) > LOG_LINES_PER_MESSAGE:
            self.log.info("[%s] ... %d more lines not shown", where, len(output.lines) - LOG_LINES_PER_MESSAGE)

    def _event(self, status: str, snapshot: JobSnapshot | None, reasons: list[str], message: str) -> dict[str, Any]:
        event: dict[str, Any] = {
            "status": status,
            "job_id": self.job_id,
            "until": self.until,
            "message": message,
            "pending_reasons": list(reasons),
        }
        if snapshot is not None:
            event.update(
                state=snapshot.state.value,
                handoff_state=snapshot.handoff_state.value if snapshot.handoff_state else None,
                direction=snapshot.direction.value,
                peer_id=snapshot.peer_id,
                backend_id=snapshot.backend_id,
                error=snapshot.error,
                exit_code=snapshot.exit_code,
            )
        return event

    async def on_kill(self) -> None:
        """A user acted on the deferred task (mark failed, mark success, clear; or another triggerer
        took the trigger over): do what ``kill_action`` says (see ``core.orphans``)."""
        if self.kill_action is KillAction.IGNORE:
            self.log.info(kill_message(self.kill_action, self.job_id))
            return
        store = AsyncFederationStore(await FederationStoreHook(self.conn_id).aget_url())
        try:
            job = (await store.snapshots([self.job_id])).get(self.job_id)
            if job is None or job.terminal or job.cancel_intent_version:
                self.log.info(kill_message(self.kill_action, self.job_id, settled=True))
                return
            message = kill_message(self.kill_action, self.job_id)
            now = int(time.time() * 1000)
            if self.kill_action is KillAction.CANCEL:
                await store.request_cancel(self.job_id, now)
            else:
                await store.record_event(self.job_id, TASK_KILLED, now, message)
            self.log.info(message)
        finally:
            await store.dispose()

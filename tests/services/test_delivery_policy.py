"""The delivery service carries out the handoff policy's decisions: a test on a small in-memory store
(the services name what they use from the store as a protocol, ``services/ports.py``), with peers
that fail as told. Nothing here needs a database: the decisions are the point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from iris_airflow_provider.backends.base import JobReport
from iris_airflow_provider.core.handoff_policy import RequeueRules
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode
from iris_airflow_provider.services.delivery import Delivery
from iris_airflow_provider.store.records import Admitted, HandoffRefusal, JobRecord
from iris_airflow_provider.store.store import RequeueOutcome

NOW = 1_700_000_000_000
RULES = RequeueRules(requeue_after_ms=300_000, avoid_ms=900_000)


def pending(job_id: str, *, peer_id: str = "cw", pin: str = "", attempts: int = 0, since: int = NOW) -> JobRecord:
    spec = parse_job({"job_id": job_id, "command": "true", "target_cluster": pin})
    return JobRecord(
        job_id=job_id,
        direction=Direction.SENT,
        handoff_state=HandoffState.PENDING,
        state=JobState.PENDING,
        peer_id=peer_id,
        backend_id="default",
        owner_principal="alice",
        submitting_user="alice",
        nonce=f"nonce-{job_id}",
        cancel_intent_version=0,
        priority_band="PRIORITY_BAND_INTERACTIVE",
        submitted_at_ms=NOW - 1000,
        scheduling_deadline_ms=None,
        spec=spec.model_dump(mode="json"),
        error="",
        exit_code=None,
        started_at_ms=None,
        finished_at_ms=None,
        reported_at_ms=None,
        updated_at_ms=NOW,
        row_version=1,
        origin=None,
        delivery_attempts=attempts,
        handoff_since_ms=since,
    )


@dataclass
class FakeStore:
    """The delivery part of the store (``DeliveryStore``): it records what the service asked for."""

    jobs: list[JobRecord]
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    requeue_outcome: RequeueOutcome = RequeueOutcome.REQUEUED
    claims: list[tuple[str, str]] = field(default_factory=list)  # ("claim" or "release", job id)
    held: set[str] = field(default_factory=set)  # deliveries another tick holds (or cancelled jobs)

    def pending_handoffs(self, now_ms: int) -> list[JobRecord]:
        return list(self.jobs)

    def begin_deliveries(
        self, incarnations: Sequence[tuple[str, str]], now_ms: int, *, stale_before_ms: int
    ) -> set[str]:
        self.claims += [("claim", job_id) for job_id, _ in incarnations]
        return {job_id for job_id, _ in incarnations if job_id not in self.held}

    def release_delivery(self, job_id: str, nonce: str) -> None:
        self.claims.append(("release", job_id))

    def mark_handed_off(self, job_id: str, nonce: str, now_ms: int, *, peer_id: str = "") -> bool:
        self.calls.append(("handed_off", job_id))
        return True

    def mark_handed_off_many(self, admitted: Sequence[Admitted], now_ms: int) -> set[str]:
        return {a.job_id for a in admitted if self.mark_handed_off(a.job_id, a.nonce, now_ms, peer_id=a.peer_id)}

    def reject_handoff(self, job_id: str, nonce: str, message: str, now_ms: int) -> bool:
        self.calls.append(("reject", job_id, message))
        return True

    def defer_delivery(self, job_id: str, nonce: str, error: str, retry_at_ms: int, now_ms: int) -> bool:
        self.calls.append(("defer", job_id, error, retry_at_ms))
        return True

    def requeue_handoff(self, refusal: HandoffRefusal, *, max_requeues: int, now_ms: int) -> RequeueOutcome:
        r = refusal
        self.calls.append(("requeue", r.job_id, r.peer_id, r.reason, r.avoid_until_ms, max_requeues))
        return self.requeue_outcome


class FailingPeer:
    peer_id = "cw"
    kind = "agentless"
    address = ""

    def __init__(self, error: PeerError | None) -> None:
        self.error = error
        self.delivered: list[Handoff] = []

    def deliver(self, handoff: Handoff) -> JobReport:
        self.delivered.append(handoff)
        if self.error is not None:
            raise self.error
        return JobReport(job_id=handoff.job_id, nonce=handoff.nonce, state=JobState.ACCEPTED, backend_id="default")


def deliver(store: FakeStore, peers: dict[str, Any], jitter: float = 1.0) -> tuple[Any, list[Any]]:
    applied: list[Any] = []

    def apply_reports(reports: Sequence[tuple[JobRecord, JobReport]]) -> set[str]:
        applied.extend((job.job_id, report.state) for job, report in reports)
        return {job.job_id for job, _ in reports}

    delivery = Delivery(
        store,
        cluster="marin",
        peers=peers,
        clock=lambda: NOW,
        jitter=lambda: jitter,
        rules=RULES,
        max_requeues=3,
        timeout_s=5,
        apply_reports=apply_reports,
    )
    return delivery.deliver(), applied


def test_a_delivered_handoff_is_marked_and_its_report_applied() -> None:
    store = FakeStore([pending("/alice/a")])
    peer = FailingPeer(None)
    done, applied = deliver(store, {"cw": peer})
    assert done.delivered == ["/alice/a"] and store.calls == [("handed_off", "/alice/a")]
    assert applied == [("/alice/a", JobState.ACCEPTED)]
    assert (peer.delivered[0].requester, peer.delivered[0].backend_id) == ("marin", "default")


def test_a_refusal_rejects_with_the_peers_own_message() -> None:
    store = FakeStore([pending("/alice/a")])
    done, _ = deliver(store, {"cw": FailingPeer(PeerError(PeerErrorCode.PERMISSION_DENIED, "not you"))})
    assert done.rejected == ["/alice/a"] and store.calls == [("reject", "/alice/a", "not you")]


def test_a_transient_failure_defers_the_next_attempt_by_the_jittered_backoff() -> None:
    store = FakeStore([pending("/alice/a", attempts=2)])
    done, _ = deliver(store, {"cw": FailingPeer(PeerError(PeerErrorCode.UNAVAILABLE, "down"))}, jitter=0.0)
    assert done.retrying == ["/alice/a"]
    assert store.calls == [("defer", "/alice/a", "unavailable: down", NOW + 10_000)]
    # Claimed before the call, released once its outcome is recorded: a cancel may trust "not found" again.
    assert store.claims == [("claim", "/alice/a"), ("release", "/alice/a")]


def test_a_delivery_it_cannot_claim_is_not_made() -> None:
    """Another tick holds it, or a cancel landed since it was read: the peer is not called."""
    store = FakeStore([pending("/alice/a"), pending("/alice/b")], held={"/alice/a"})
    peer = FailingPeer(None)
    done, _ = deliver(store, {"cw": peer})
    assert [handoff.job_id for handoff in peer.delivered] == ["/alice/b"]
    assert done.delivered == ["/alice/b"] and store.calls == [("handed_off", "/alice/b")]


@pytest.mark.parametrize(
    ("outcome", "lands_in"), [(RequeueOutcome.REQUEUED, "requeued"), (RequeueOutcome.EXHAUSTED, "rejected")]
)
def test_a_peer_without_room_sends_an_unpinned_job_back_to_the_queue(outcome: RequeueOutcome, lands_in: str) -> None:
    store = FakeStore([pending("/alice/a")], requeue_outcome=outcome)
    done, _ = deliver(store, {"cw": FailingPeer(PeerError(PeerErrorCode.RESOURCE_EXHAUSTED, "full"))})
    assert getattr(done, lands_in) == ["/alice/a"]
    assert store.calls == [("requeue", "/alice/a", "cw", "resource_exhausted: full", NOW + RULES.avoid_ms, 3)]


def test_a_pinned_job_retries_its_peer_instead() -> None:
    store = FakeStore([pending("/alice/a", pin="cw")])
    done, _ = deliver(store, {"cw": FailingPeer(PeerError(PeerErrorCode.RESOURCE_EXHAUSTED, "full"))})
    assert done.retrying == ["/alice/a"] and store.calls[0][0] == "defer"


def test_a_job_for_a_peer_no_longer_configured_is_requeued() -> None:
    store = FakeStore([replace(pending("/alice/a"), peer_id="gone")])
    done, _ = deliver(store, {})
    assert done.requeued == ["/alice/a"]
    assert store.calls == [("requeue", "/alice/a", "gone", "peer gone is not configured", NOW + RULES.avoid_ms, 3)]


def test_a_job_failing_for_the_requeue_period_is_requeued() -> None:
    store = FakeStore([pending("/alice/a", since=NOW - RULES.requeue_after_ms)])
    done, _ = deliver(store, {"cw": FailingPeer(PeerError(PeerErrorCode.UNAVAILABLE, "down"))})
    assert done.requeued == ["/alice/a"]

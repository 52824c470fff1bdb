"""What the services need from the federation store, as small protocols.

Each service names the part it uses, so a service test can run on a fake store;
:class:`~iris_airflow_provider.store.store.FederationStore` provides them all (``ServiceStore``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from iris_airflow_provider.core.availability import PeerBackend, PeerState
from iris_airflow_provider.core.holds import Hold
from iris_airflow_provider.core.job_report import ChildReport, JobReport
from iris_airflow_provider.core.ledger import BackendKey
from iris_airflow_provider.core.peer_loss import LostDecision
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.reservations import InFlight
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.store.records import (
    Admitted,
    CancelOutcome,
    HandoffRefusal,
    JobRecord,
    NewIncarnation,
    PeerRecord,
    QueuedJob,
)
from iris_airflow_provider.store.store import AbandonedHandoff, Admission, RequeueOutcome, TokenUse


class JobReads(Protocol):
    def get_job(self, job_id: str) -> JobRecord | None: ...

    def get_jobs(self, job_ids: Iterable[str]) -> dict[str, JobRecord]: ...


class MirrorStore(JobReads, Protocol):
    """Taking in what backends and peers report: states, output, sync cursors."""

    def in_flight(self) -> list[JobRecord]: ...

    def mirror_many(self, reports: Sequence[JobReport], now_ms: int) -> set[str]: ...

    def mark_gone(self, job_id: str, nonce: str, now_ms: int) -> bool: ...

    def append_logs(self, job_id: str, nonce: str, lines: Sequence[str], cursor: str, now_ms: int) -> bool: ...

    def sync_cursor(self, peer_id: str) -> str: ...

    def save_sync_cursors(self, cursors: Mapping[str, str], now_ms: int) -> None: ...

    def mirror_children(self, job_id: str, nonce: str, children: Sequence[ChildReport], now_ms: int) -> bool: ...

    def append_child_logs(
        self, job_id: str, nonce: str, child_id: str, lines: Sequence[str], cursor: str, now_ms: int
    ) -> bool: ...

    def note_child(self, child_key: str, state: JobState, exit_code: int | None, now_ms: int) -> bool: ...


class PeerStateReads(Protocol):
    def peer_states(self) -> list[PeerState]: ...


class HeartbeatStore(PeerStateReads, Protocol):
    """Peers as last heard from."""

    def record_heartbeats(
        self, answers: Mapping[str, Sequence[PeerBackend] | BaseException], now_ms: int, *, asked_at_ms: int
    ) -> None: ...

    def forget_peers(self, keep: Iterable[str]) -> None: ...

    def peers(self) -> list[PeerRecord]: ...


class SubmitStore(JobReads, Protocol):
    def admit(self, new: NewIncarnation, now_ms: int) -> Admission: ...

    def reincarnate(self, new: NewIncarnation, now_ms: int) -> JobRecord | None: ...

    def fail_start(self, job_id: str, nonce: str, error: str, now_ms: int) -> bool: ...


class CancelStore(JobReads, Protocol):
    def request_cancel(self, job_id: str, now_ms: int) -> CancelOutcome: ...

    def request_cancel_tree(self, key: str, now_ms: int) -> list[tuple[str, CancelOutcome]]: ...

    def live_children(self) -> list[JobRecord]: ...

    def record_event(self, job_id: str, kind: str, now_ms: int, detail: str = "") -> bool: ...

    def pending_cancels(self) -> list[JobRecord]: ...

    def mark_gone(self, job_id: str, nonce: str, now_ms: int) -> bool: ...

    def confirm_cancel(self, job_id: str, nonce: str, version: int, now_ms: int) -> None: ...

    def cancel_never_had(self, record: JobRecord, error: str, now_ms: int) -> bool: ...

    def live_jobs_with_origin(self) -> list[JobRecord]: ...


class AbandonedStore(Protocol):
    """Incarnations a requeue left on peers."""

    def abandoned_handoffs(self) -> list[AbandonedHandoff]: ...

    def forget_abandoned(self, handoff: AbandonedHandoff, now_ms: int, *, terminated: bool) -> None: ...


class PlacementStore(AbandonedStore, PeerStateReads, Protocol):
    def queued_for_placement(self) -> list[QueuedJob]: ...

    def get_jobs(self, job_ids: Iterable[str]) -> dict[str, JobRecord]: ...

    def in_flight_handoffs(self) -> list[InFlight]: ...

    def capacity_holds(self) -> dict[str, BackendKey]: ...

    def save_holds(self, holds: Iterable[Hold], now_ms: int) -> dict[str, BackendKey]: ...

    def expire_queued(self, now_ms: int) -> list[str]: ...

    def apply_promotions(self, promotions: Iterable[Promotion], now_ms: int) -> list[Promotion]: ...

    def flag(self, job_id: str, nonce: str, kind: str, message: str, now_ms: int, *, peer_id: str = "") -> bool: ...


class DeliveryStore(Protocol):
    """Handing promoted jobs to their peers, and what a failed delivery leads to."""

    def pending_handoffs(self, now_ms: int) -> list[JobRecord]: ...

    def begin_deliveries(
        self, incarnations: Sequence[tuple[str, str]], now_ms: int, *, stale_before_ms: int
    ) -> set[str]: ...

    def release_delivery(self, job_id: str, nonce: str) -> None: ...

    def mark_handed_off(self, job_id: str, nonce: str, now_ms: int, *, peer_id: str = "") -> bool: ...

    def mark_handed_off_many(self, admitted: Sequence[Admitted], now_ms: int) -> set[str]: ...

    def reject_handoff(self, job_id: str, nonce: str, message: str, now_ms: int) -> bool: ...

    def defer_delivery(self, job_id: str, nonce: str, error: str, retry_at_ms: int, now_ms: int) -> bool: ...

    def requeue_handoff(self, refusal: HandoffRefusal, *, max_requeues: int, now_ms: int) -> RequeueOutcome: ...


class LostPeerStore(Protocol):
    """Settling the jobs of lost (or removed) peers."""

    def peers(self) -> list[PeerRecord]: ...

    def live_handoff_peers(self) -> set[str]: ...

    def handoffs_on(self, peer_ids: Iterable[str]) -> list[JobRecord]: ...

    def queued_pinned_to(self, peer_ids: Iterable[str]) -> list[JobRecord]: ...

    def settle_lost(
        self, record: JobRecord, decision: LostDecision, *, now_ms: int, avoid_until_ms: int, max_requeues: int
    ) -> RequeueOutcome | JobState | None: ...

    def fail_pinned_to_removed(self, record: JobRecord, now_ms: int) -> bool: ...


class WithdrawalStore(Protocol):
    """Withdrawing jobs a peer accepted but did not start."""

    def peers(self) -> list[PeerRecord]: ...

    def not_started_handoffs(self) -> list[JobRecord]: ...

    def withdrawals(self) -> list[JobRecord]: ...

    def begin_withdrawal(self, record: JobRecord, reason: str, now_ms: int) -> bool: ...

    def finish_withdrawal(
        self, record: JobRecord, *, now_ms: int, avoid_until_ms: int, max_requeues: int
    ) -> RequeueOutcome: ...


class SeenTokenStore(Protocol):
    """Peer tokens used here (single use)."""

    def use_token(self, issuer: str, jti: str, usable_until_ms: int, now_ms: int, *, max_live: int) -> TokenUse: ...


class RetentionStore(Protocol):
    def finished_before(self, cutoff_ms: int, limit: int) -> list[JobRecord]: ...

    def prune_jobs(self, incarnations: Sequence[tuple[str, str]], cutoff_ms: int) -> list[str]: ...

    def prune_superseded_output(self, cutoff_ms: int, limit: int) -> int: ...


class LeaseStore(Protocol):
    def acquire_lease(self, name: str, holder: str, now_ms: int, ttl_ms: int) -> bool: ...

    def release_lease(self, name: str, holder: str) -> None: ...


class ServiceStore(
    RetentionStore,
    LeaseStore,
    MirrorStore,
    HeartbeatStore,
    SubmitStore,
    CancelStore,
    PlacementStore,
    DeliveryStore,
    LostPeerStore,
    WithdrawalStore,
    Protocol,
):
    """Everything the federation services use (the real store)."""

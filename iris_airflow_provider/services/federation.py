"""The federation operations behind one facade: submit, cancel and the placement tick.

Everything here is plain Python over the store, this cluster's backends and its peers; the
Airflow operator, sensor, trigger and DAG only call into it. :class:`Federation` wires the
services together (submit, cancel, heartbeat, placement, delivery, mirror, tick: one module
each) and keeps the public methods callers use.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping

from iris_airflow_provider.backends.base import Backend, now_ms
from iris_airflow_provider.core.availability import LocalBackend, PeerState
from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.handoff_policy import RequeueRules
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.orphans import KillAction
from iris_airflow_provider.core.ownership import service_principal_allowed, service_principal_refused
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_snapshot import PlacementRules
from iris_airflow_provider.core.router import Decision
from iris_airflow_provider.peers.base import Peer
from iris_airflow_provider.services.bundle_retention import admit_upload, collect_bundles
from iris_airflow_provider.services.cancel import Cancels
from iris_airflow_provider.services.children import ChildJobs
from iris_airflow_provider.services.delivery import Delivery
from iris_airflow_provider.services.heartbeat import Heartbeats
from iris_airflow_provider.services.job_tokens import JobTokens, renew_token_files
from iris_airflow_provider.services.lost_peers import LostPeers
from iris_airflow_provider.services.mirror import Mirror
from iris_airflow_provider.services.orphans import TaskStates, task_killed
from iris_airflow_provider.services.placement import Placement, queued_candidates
from iris_airflow_provider.services.runners import Runners
from iris_airflow_provider.services.settings import ClusterSettings
from iris_airflow_provider.services.submit import IdentityError, Submitted, Submitter
from iris_airflow_provider.services.tick import Tick, TickReport
from iris_airflow_provider.services.withdrawals import Withdrawals
from iris_airflow_provider.store.records import CancelOutcome, JobRecord, Origin
from iris_airflow_provider.store.store import FederationStore


class Federation:
    def __init__(
        self,
        config: ClusterSettings,
        store: FederationStore,
        *,
        backends: Mapping[str, Backend],
        peers: Mapping[str, Peer],
        clock: Callable[[], int] = now_ms,
        jitter: Callable[[], float] = random.random,
        job_tokens: JobTokens | None = None,
        own_url: str = "",
    ) -> None:
        self.config = config
        self.store = store
        self.backends = dict(backends)
        self.peers = dict(peers)
        self.clock = clock
        self.jitter = jitter
        self.settings = config.placement
        settings = self.settings
        self.heartbeats = Heartbeats(
            store,
            peers=self.peers,
            clock=clock,
            timeout_s=settings.heartbeat_timeout_seconds,
            staleness_ms=self.staleness_ms,
        )
        runners = Runners(self.backends, self.peers)
        avoid_ms = int(settings.requeue_avoid_seconds * 1000)
        self.mirror = Mirror(
            store,
            runners=runners,
            clock=clock,
            timeout_s=settings.heartbeat_timeout_seconds,
            # Where users reach this cluster's serving relay: the only origin, with the peers' own
            # api-servers, a peer's serving URLs may point at (core/serving.py).
            relay_origin=config.federation.public_parent or own_url,
        )
        self.submitter = Submitter(
            store,
            default_region=config.default_region,
            backends=self.backends,
            heartbeats=self.heartbeats,
            clock=clock,
            apply_report=self.mirror.apply_report,
            job_env=job_tokens.job_env if job_tokens else None,
        )
        delivery_timeout_ms = int(settings.delivery_timeout_seconds * 1000)
        self.cancels = Cancels(store, runners=runners, clock=clock, delivery_timeout_ms=delivery_timeout_ms)
        self.placement = Placement(store, peer_ids=self.peers, rules=self.placement_rules, clock=clock)
        self.delivery = Delivery(
            store,
            cluster=config.name,
            peers=self.peers,
            clock=clock,
            jitter=jitter,
            rules=RequeueRules(
                requeue_after_ms=int(settings.requeue_after_seconds * 1000),
                avoid_ms=avoid_ms,
            ),
            max_requeues=settings.max_requeues,
            timeout_s=settings.delivery_timeout_seconds,
            apply_reports=self.mirror.apply_reports,
        )
        self.lost_peers = LostPeers(
            store,
            peer_ids=list(self.peers),
            clock=clock,
            peer_lost_ms=int(settings.peer_lost_seconds * 1000),
            avoid_ms=avoid_ms,
            max_requeues=settings.max_requeues,
        )
        self.withdrawals = Withdrawals(
            store,
            runners=runners,
            clock=clock,
            start_timeout_s=settings.start_timeout_seconds,
            staleness_ms=self.staleness_ms,
            avoid_ms=avoid_ms,
            max_requeues=settings.max_requeues,
        )
        self._tick = Tick(
            store=store,
            clock=clock,
            heartbeats=self.heartbeats,
            placement=self.placement,
            delivery=self.delivery,
            mirror=self.mirror,
            cancels=self.cancels,
            lost_peers=self.lost_peers,
            withdrawals=self.withdrawals,
            timeout_s=settings.heartbeat_timeout_seconds,
            retention_ms=int(config.retention_days * 86_400_000),
            renew_job_tokens=(
                (lambda in_flight: renew_token_files(job_tokens, in_flight, runners.backend_of)) if job_tokens else None
            ),
            collect_bundles=self.collect_bundles,
        )
        # What a running job may do with this cluster (submit, wait for and cancel its children),
        # authenticated by its job token: only where this cluster issues them.
        self.children = (
            ChildJobs(store, tokens=job_tokens, submitter=self.submitter, cancels=self.cancels, clock=clock)
            if job_tokens
            else None
        )

    def collect_bundles(self, now_ms: int) -> list[str]:
        """Let go of the workdir bundles (and abandoned uploads) no live job needs any more."""
        return collect_bundles(self.store, self.config.bundle_store(), self.config.bundles.retention, now_ms)

    def admit_bundle_upload(self, ref: BundleRef) -> str:
        """Admit a new upload of ``ref`` to this cluster's bundle store, or say why it does not fit."""
        return admit_upload(self.store, self.config.bundle_store(), ref, self.config.bundles.retention, self.clock())

    @property
    def staleness_ms(self) -> int:
        return int(self.settings.heartbeat_staleness_seconds * 1000)

    @property
    def placement_rules(self) -> PlacementRules:
        return PlacementRules(
            max_per_peer=self.settings.max_handoffs_per_cycle,
            staleness_ms=self.staleness_ms,
            reserve_after_ms=int(self.settings.reserve_after_seconds * 1000) or None,
        )

    # Submit ------------------------------------------------------------------------------------

    def local_backends(self) -> list[LocalBackend]:
        return self.submitter.local_backends()

    def peer_states(self, *, refresh_stale: bool = False) -> list[PeerState]:
        """The configured peers as last heartbeated (a peer never heard from is unreachable).

        With ``refresh_stale``, peers without a fresh heartbeat are asked now (see ``refresh_stale_peers``).
        """
        if refresh_stale:
            self.refresh_stale_peers()
        return self.heartbeats.configured_states()

    def refresh_stale_peers(self) -> bool:
        """Ask the peers without a fresh heartbeat for one now, unless they were asked in the last
        ``STALE_PROBE_COOLDOWN_MS``: a dead peer then slows one submit in a while, not every one.
        Returns whether any peer was asked."""
        return self.heartbeats.refresh_stale()

    def classify(self, spec: JobSpec) -> Decision:
        return self.submitter.classify(spec)

    def check_service_principal(self, principal: str, dag_id: str) -> None:
        """Refuse an explicit submitter the cluster file does not allow for ``dag_id`` (IdentityError)."""
        if not service_principal_allowed(principal, dag_id, self.config.federation.service_principals):
            raise IdentityError(service_principal_refused(principal, dag_id))

    def submit(
        self, spec: JobSpec, *, submitting_user: str, origin: Origin | None = None, owner_principal: str = ""
    ) -> Submitted:
        return self.submitter.submit(
            spec, submitting_user=submitting_user, origin=origin, owner_principal=owner_principal
        )

    def start_received(self, job_id: str, nonce: str) -> JobRecord:
        return self.submitter.start_received(job_id, nonce)

    # Cancel ------------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> CancelOutcome:
        return self.cancels.cancel(job_id)

    def task_killed(self, job_id: str, action: KillAction) -> str:
        """The task waiting on ``job_id`` was killed: cancel the job, ask the tick to check the
        task's state now, or nothing, as ``action`` says; returns what the task log should say."""
        return task_killed(self.store, self.cancels.cancel, job_id, action, self.clock())

    # The tick ----------------------------------------------------------------------------------

    def tick(self, *, task_states: TaskStates | None = None) -> TickReport:
        """Heartbeats, expiry, placement, delivery, status sync, cancel re-drive: one pass of each.

        With ``task_states`` (Airflow's view of the tasks that submitted jobs), jobs whose task has
        failed are cancelled first: nobody will reattach to them (a user marked the task or its run
        failed, or it failed for good after its worker was lost). A kill alone never decides that.
        """
        return self._tick.run(task_states)

    def candidates(self, queued: Iterable[JobRecord], now_ms: int) -> list[Candidate]:
        """Queued jobs as the placement pass sees them at ``now_ms`` (see ``placement.queued_candidates``)."""
        return queued_candidates(self.store, queued, now_ms)

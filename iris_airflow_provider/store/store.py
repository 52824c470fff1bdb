"""The federation store: the single source of truth for jobs, peers, holds and leases.

Every state change is a conditional write (compare-and-set on the expected state and the cancel
intent), in the same transaction as its history event, so concurrent ticks, cancels, retries and
workers can race freely without corrupting anything: a promotion only happens to a job that is
still queued, uncancelled and not terminal, and a cancel racing it always wins.

:class:`FederationStore` is the one object callers hold; each concern lives in its own module
(one mixin each, all sharing the engine and the transactions of :mod:`.common`):

- :mod:`.migrate`: schema migrations;
- :mod:`.jobs`: admission, reads, transitions, cancels;
- :mod:`.expiries`: queued jobs past their scheduling deadline;
- :mod:`.promotions`: the placement pass's promotions, by compare-and-set;
- :mod:`.deliveries`: the delivery claim, and the peer's admission (handed off);
- :mod:`.handoffs`: failed deliveries (rejected, deferred, requeued), incarnations left on peers;
- :mod:`.reports`: what a job's runner reports (mirrored), and that it no longer has the job;
- :mod:`.requeue`: moving a handoff back to the queue under a new incarnation;
- :mod:`.lifecycle`: cancels the peer answered, lost peers, withdrawals for a start timeout;
- :mod:`.reservations`: what jobs in flight reserve on their peers (read from the jobs);
- :mod:`.holds`: backends held for starving jobs;
- :mod:`.heartbeats`: peers and their backends;
- :mod:`.logs`: relayed output and history events;
- :mod:`.results`: what each incarnation handed back at ``$IRIS_RESULT``;
- :mod:`.feed`: what peers read (received jobs and changes) and sync cursors;
- :mod:`.leases`: named expiring locks;
- :mod:`.retention`: pruning finished jobs past the retention;
- :mod:`.seen_tokens`: peer tokens already used here (single use);
- :mod:`.trees`: children admitted under a live parent, whole trees cancelled.
"""

from __future__ import annotations

from typing import Any

from iris_airflow_provider.store.deliveries import Deliveries
from iris_airflow_provider.store.engine import create_store_engine
from iris_airflow_provider.store.expiries import Expiries
from iris_airflow_provider.store.feed import Feed
from iris_airflow_provider.store.handoffs import AbandonedHandoff, Handoffs
from iris_airflow_provider.store.heartbeats import Heartbeats
from iris_airflow_provider.store.holds import Holds
from iris_airflow_provider.store.jobs import Admission, Jobs, request_cancel
from iris_airflow_provider.store.leases import Leases
from iris_airflow_provider.store.lifecycle import Lifecycle
from iris_airflow_provider.store.logs import Logs
from iris_airflow_provider.store.migrate import Migrations
from iris_airflow_provider.store.promotions import Promotions
from iris_airflow_provider.store.reports import Reports
from iris_airflow_provider.store.requeue import RequeueOutcome
from iris_airflow_provider.store.reservations import Reservations
from iris_airflow_provider.store.results import Results
from iris_airflow_provider.store.retention import Retention
from iris_airflow_provider.store.seen_tokens import SeenTokens, TokenUse
from iris_airflow_provider.store.trees import Trees

__all__ = ["AbandonedHandoff", "Admission", "FederationStore", "RequeueOutcome", "TokenUse", "request_cancel"]


class FederationStore(
    Migrations,
    Jobs,
    Expiries,
    Promotions,
    Deliveries,
    Handoffs,
    Reports,
    Lifecycle,
    Reservations,
    Holds,
    Heartbeats,
    Logs,
    Results,
    Feed,
    Leases,
    Retention,
    SeenTokens,
    Trees,
):
    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> FederationStore:
        return cls(create_store_engine(url, **engine_options))

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    def dispose(self) -> None:
        self.engine.dispose()

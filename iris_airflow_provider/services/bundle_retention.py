"""The bundle store kept bounded: the tick lets go of what the retention rule says, and a peer
refuses an upload that cannot fit, admitting the others one at a time, each promised its room.

The rule is ``core/bundle_retention.py``; the live jobs' bundles come from the federation store,
the entries from one listing of the bundle store (``backends/bundle_collection.py``), both each
tick (no throttle: a listing of a few thousand names and one indexed query are cheap beside the
rest of the tick). The job store is read only when the bundle store holds complete bundles.
"""

from __future__ import annotations

import logging
from typing import Protocol

from iris_airflow_provider.backends.bundle_collection import (
    list_store,
    mark_used,
    remove_bundle,
    remove_partial,
    remove_stray,
)
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundle_retention import (
    BUDGET_GRACE_MS,
    RetentionRules,
    plan_collection,
    upload_refusal,
)
from iris_airflow_provider.core.bundles import BundleRef

log = logging.getLogger(__name__)


class BundleReferences(Protocol):
    def live_bundle_digests(self) -> set[str]: ...


def collect_bundles(store: BundleReferences, bundles: BundleStore, rules: RetentionRules, now_ms: int) -> list[str]:
    """Delete what the rule lets go at ``now_ms``; what went (``sha256:<hex>``, ``partial sha256:<hex>``)."""
    listing = list_store(bundles)
    if not listing.bundles and not listing.partials and not listing.strays:
        return []
    referenced = store.live_bundle_digests() if listing.bundles else set()
    for bundle in listing.bundles:
        # A live job's bundle is in use however long the job runs: touched (once per grace period,
        # not every tick), its days unused count from the end of the last job that needed it.
        if bundle.digest in referenced and now_ms - bundle.last_used_ms >= BUDGET_GRACE_MS:
            mark_used(bundles, bundle, now_ms)
    plan = plan_collection(listing.bundles, listing.partials, referenced, now_ms, rules, strays=listing.strays)
    removed: list[str] = []
    try:
        removed += [f"partial {p.digest}" for p in plan.partials if remove_partial(bundles, p, listing)]
        removed += [f"stray {f.name}" for f in plan.strays if remove_stray(bundles, f, listing)]
        removed += [b.digest for b in plan.bundles if remove_bundle(bundles, b, listing)]
    except OSError as error:  # a store this process may not write: the tick goes on, the log says why
        log.warning("Bundle store %s: could not let go of a bundle: %s", bundles.directory, error)
    if removed:
        log.info(
            "Bundle store %s: let go of %d bundle(s) and abandoned upload(s) (%d of %d bytes planned): %s",
            bundles.directory,
            len(removed),
            plan.freed_bytes,
            plan.total_bytes,
            ", ".join(removed),
        )
    return removed


def admit_upload(
    store: BundleReferences, bundles: BundleStore, ref: BundleRef, rules: RetentionRules, now_ms: int
) -> str:
    """Admit an upload of ``ref`` that has not begun here, promising it its room; or say why it may
    not start ("" when admitted, or when it is here or admitted already): it would take the store past
    ``bundles.max_total_bytes``, beside the bytes uploads admitted before have still to send, even
    once everything collectable is gone. Judged one at a time (``BundleStore.admitting``)."""
    if bundles.peek(ref) or bundles.is_uploading(ref):
        return ""
    with bundles.admitting():
        if bundles.peek(ref) or bundles.is_uploading(ref):
            return ""
        listing = list_store(bundles)
        referenced = store.live_bundle_digests() if listing.bundles else set()
        problem = upload_refusal(
            ref.digest, ref.size, listing.bundles, listing.partials, referenced, now_ms, rules, strays=listing.strays
        )
        if not problem:
            bundles.reserve(ref)
        return problem

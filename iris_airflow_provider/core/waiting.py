"""Why a queued job waits, from the same placement pass a tick would run now.

Builds on :func:`iris_airflow_provider.core.explain.explain` (peer by peer, backend by backend)
with the job's place in the queue, the object-store paths each backend could not read, and a
status: ``expiring`` (its deadline passed), ``placeable`` (the next tick promotes it),
``never_fits`` (no reachable backend could ever hold it: it stays queued, but waiting will not
help), ``holding`` (it has waited long enough to hold a backend, and waits for it) or ``waiting``;
``changed`` when the job is no longer queued in the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.explain import explain
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.object_stores import unreadable_paths
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place


def explain_waiting(spec: JobSpec, snapshot: PlacementSnapshot, rules: PlacementRules) -> dict[str, Any]:
    """``{"status", "summary", "explanation"}`` for the queued job ``spec`` (no explanation if ``changed``)."""
    candidates = snapshot.candidates
    mine = next((c for c in candidates if c.job_id == spec.job_id), None)
    if mine is None:  # promoted or cancelled since it was read
        return {"status": "changed", "summary": "It changed while being explained; reload."}
    now_ms = snapshot.now_ms
    result = place(snapshot, rules)
    ahead = sum(1 for c in candidates if c.queue_key() < mine.queue_key())
    detail = explain(
        mine,
        snapshot.peers,
        result,
        now_ms=now_ms,
        staleness_ms=rules.staleness_ms,
        max_per_peer=rules.max_per_peer,
    )
    mark_unreadable_paths(detail, spec, snapshot.peers)
    explanation = {"jobs_ahead": ahead, "queued_jobs": len(candidates), **detail}
    if mine.expired(now_ms):
        summary = "Its scheduling deadline has passed: the next tick ends it as unschedulable."
        return {"status": "expiring", "summary": summary, "explanation": explanation}
    promotion = next((p for p in result.promotions if p.job_id == spec.job_id), None)
    if promotion is not None:
        target = f"{promotion.peer_id}/{promotion.backend_id or '(any backend)'}"
        how = " by reclaiming capacity held by lower bands" if promotion.preempts else ""
        summary = f"It fits now on {target}{how}: the next placement tick promotes it."
        return {"status": "placeable", "summary": summary, "explanation": explanation}
    status = "never_fits" if detail["never_fits"] else "holding" if "holding" in detail else "waiting"
    return {"status": status, "summary": detail["summary"], "explanation": explanation}


def mark_unreadable_paths(detail: dict[str, Any], spec: JobSpec, peers: Iterable[PeerState]) -> None:
    """On each backend row of ``detail``, the object-store paths of the job that backend could not read."""
    advertised = {(p.peer_id, b.backend_id): b.advertised for p in peers for b in p.backends}
    for peer_row in detail["peers"]:
        for row in peer_row["backends"]:
            paths = unreadable_paths(spec, advertised.get((peer_row["peer_id"], row["backend_id"]), {}))
            if paths:
                row["unreadable_paths"] = [f"{path.where}={path.uri}" for path in paths]

"""What the Federation page, its JSON API and the ``iris-federation`` CLI show.

- ``list_peers``: the seed's list-peers shape (``{"peers": [{"peer_id", "controller_address",
  "reachable", "last_contact_ms", "active_federated_jobs", "backends": [{"backend_id", "kind",
  "advertised_attributes": {key: {"values": [...]}}, "pending_task_count", "running_task_count",
  "availability": {...}}]}]}``), with numbers as JSON numbers rather than proto3's strings, plus
  this cluster's own backends and a fleet summary (free/total per variant across local backends
  and reachable peers: an unreachable or stale peer's numbers are unknown, not free).
- ``job_view`` / ``describe_job``: a job with its exact pending reason, its history and the task
  instance that submitted it.
- ``explain_job``: why a job waits, from the same placement pass a tick would run now.

Read-only: nothing here changes the store.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.federation.availability import PeerBackend, PeerState
from iris_airflow_provider.federation.explain import explain
from iris_airflow_provider.federation.ledger import LedgerEntry
from iris_airflow_provider.federation.object_stores import unreadable_paths
from iris_airflow_provider.federation.placement import plan
from iris_airflow_provider.federation.states import Direction, HandoffState, JobState
from iris_airflow_provider.runner import RUNNER_DAG_ID, runner_run_id
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.queries import ActiveCount, MonitoringQueries, job_dag_id
from iris_airflow_provider.store.records import BackendRecord, JobRecord, pending_reason_history
from iris_airflow_provider.store.schema import job_logs

OUTPUT_TAIL_LINES = 100
DESCRIBE_CACHE_MS = 4_000

_described: dict[int, tuple[Backend, int, PeerBackend]] = {}
_described_lock = threading.Lock()


def advertised_wire(attributes: Mapping[str, Iterable[Any]]) -> dict[str, dict[str, list[Any]]]:
    """Advertised attributes in the list-peers shape: ``{"device-type": {"values": ["gpu"]}}``."""
    return {key: {"values": list(values)} for key, values in sorted(attributes.items())}


def _backend_entry(
    backend_id: str,
    kind: str,
    attributes: Mapping[str, Iterable[Any]],
    availability: Mapping[str, Any] | None,
    counts: Mapping[JobState, int],
) -> dict[str, Any]:
    return {
        "backend_id": backend_id,
        "kind": kind,
        "advertised_attributes": advertised_wire(attributes),
        "pending_task_count": counts.get(JobState.PENDING, 0) + counts.get(JobState.ACCEPTED, 0),
        "running_task_count": counts.get(JobState.RUNNING, 0),
        "availability": dict(availability) if availability is not None else None,
    }


def list_peers(federation: Federation, now_ms: int) -> dict[str, Any]:
    """Peers (as last heartbeated), local backends (asked now) and the fleet summary."""
    config = federation.config
    staleness_ms = federation.staleness_ms
    records = {record.peer_id: record for record in federation.store.peers()}
    ledger = {entry.key: entry for entry in federation.store.ledger()}
    counts: dict[tuple[Direction, str, str], dict[JobState, int]] = defaultdict(dict)
    active_by_peer: dict[str, int] = defaultdict(int)
    for row in MonitoringQueries(federation.store).active_counts():
        _count(counts, row)
        if row.direction is Direction.SENT and row.peer_id:
            active_by_peer[row.peer_id] += row.count

    peers = []
    for peer_config in sorted(config.peers, key=lambda p: p.id):
        record = records.get(peer_config.id)
        last_contact = record.last_contact_ms if record else None
        fresh = last_contact is not None and now_ms - last_contact <= staleness_ms
        backends: tuple[BackendRecord, ...] = record.backends if record else ()
        peers.append(
            {
                "peer_id": peer_config.id,
                "kind": peer_config.kind,
                "controller_address": getattr(peer_config, "url", ""),
                # What placement uses: answered the last heartbeat, and that was recent enough.
                "reachable": bool(record and record.reachable and fresh),
                "stale": bool(record and record.reachable and not fresh),
                "last_contact_ms": last_contact,
                "heartbeat_age_ms": now_ms - last_contact if last_contact is not None else None,
                "last_attempt_ms": record.last_attempt_ms if record else None,
                "last_error": record.last_error if record else "",
                "active_federated_jobs": active_by_peer.get(peer_config.id, 0),
                "backends": [
                    _with_reserved(
                        _backend_entry(
                            b.backend_id,
                            b.kind,
                            b.attributes,
                            b.availability,
                            counts.get((Direction.SENT, peer_config.id, b.backend_id), {}),
                        ),
                        ledger.get((peer_config.id, b.backend_id)),
                        b.observation_epoch_ms,
                    )
                    for b in backends
                ],
            }
        )

    local = []
    for backend_id, backend in sorted(federation.backends.items()):
        here = _merge(counts.get((Direction.LOCAL, "", backend_id), {}), _received(counts, backend_id))
        try:
            described = _describe(backend, now_ms)
        except Exception as error:  # a backend that cannot answer (e.g. its API is down) is shown as such
            entry = _backend_entry(backend_id, backend.kind, {}, None, here)
            entry["error"] = str(error) or type(error).__name__
        else:
            block = described.availability.to_wire() if described.availability else None
            entry = _backend_entry(backend_id, described.kind or backend.kind, described.advertised, block, here)
        local.append(entry)

    return {
        "cluster": config.name,
        "now_ms": now_ms,
        "heartbeat_staleness_ms": staleness_ms,
        "peers": peers,
        "local_backends": local,
        "fleet": fleet_summary(config.name, local, peers),
    }


def _describe(backend: Backend, now_ms: int) -> PeerBackend:
    """A local backend's capacity, asked at most every few seconds: every open page polls it, and a
    Kubernetes backend answers by listing nodes and pods."""
    key = id(backend)
    with _described_lock:
        cached = _described.get(key)
        if cached is not None and cached[0] is backend and now_ms - cached[1] < DESCRIBE_CACHE_MS:
            return cached[2]
    described = backend.describe()
    with _described_lock:
        _described[key] = (backend, now_ms, described)
    return described


def _with_reserved(entry: dict[str, Any], ledger: LedgerEntry | None, observed_ms: int | None) -> dict[str, Any]:
    """What placement already promoted against this observation: the advertised free amount is not
    spent again until the peer reports a newer one, so the page shows it beside the meter."""
    current = ledger is not None and observed_ms is not None and ledger.observation_epoch_ms == observed_ms
    entry["reserved"] = dict(ledger.reserved) if current and ledger is not None else {}
    return entry


def _count(counts: dict[tuple[Direction, str, str], dict[JobState, int]], row: ActiveCount) -> None:
    bucket = counts[(row.direction, row.peer_id, row.backend_id)]
    bucket[row.state] = bucket.get(row.state, 0) + row.count


def _received(
    counts: Mapping[tuple[Direction, str, str], Mapping[JobState, int]], backend_id: str
) -> dict[JobState, int]:
    merged: dict[JobState, int] = {}
    for (direction, _peer, backend), states in counts.items():
        if direction is Direction.RECEIVED and backend == backend_id:
            merged = _merge(merged, states)
    return merged


def _merge(a: Mapping[JobState, int], b: Mapping[JobState, int]) -> dict[JobState, int]:
    return {state: a.get(state, 0) + b.get(state, 0) for state in set(a) | set(b)}


def fleet_summary(cluster: str, local: list[dict[str, Any]], peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Free/total per device variant over local backends and reachable peers, with each target's share."""
    by_variant: dict[str, dict[str, Any]] = {}
    targets = [(cluster, b) for b in local]
    targets += [(peer["peer_id"], b) for peer in peers if peer["reachable"] for b in peer["backends"]]
    for owner, backend in targets:
        block = backend.get("availability") or {}
        totals = block.get("total_amounts") or {}
        free = block.get("amounts") or {}
        for variant in sorted(set(totals) | set(free)):
            entry = by_variant.setdefault(
                variant, {"variant": variant, "free": 0, "total": 0, "reserved": 0, "targets": []}
            )
            reserved = int((backend.get("reserved") or {}).get(variant, 0))
            entry["free"] += int(free.get(variant, 0))
            entry["total"] += int(totals.get(variant, 0))
            entry["reserved"] += reserved
            entry["targets"].append(
                {
                    "target": f"{owner}/{backend['backend_id']}",
                    "free": int(free.get(variant, 0)),
                    "total": int(totals.get(variant, 0)),
                    "reserved": reserved,
                }
            )
    return [by_variant[variant] for variant in sorted(by_variant)]


# Jobs ---------------------------------------------------------------------------------------------


def task_instance_path(job: JobRecord) -> str | None:
    """Where the Airflow UI shows the task instance behind ``job``, relative to the UI's base URL."""
    if job.origin is not None:
        dag_id, run_id, task_id, map_index = job.origin.dag_id, job.origin.run_id, job.origin.task_id, None
        if job.origin.map_index is not None and job.origin.map_index >= 0:
            map_index = job.origin.map_index
    elif job.direction is Direction.RECEIVED:
        dag_id, run_id, task_id, map_index = RUNNER_DAG_ID, runner_run_id(job.job_id, job.nonce), "run", None
    else:
        return None
    path = f"dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    return f"{path}/mapped/{map_index}" if map_index is not None else path


def resources_summary(spec: Mapping[str, Any]) -> str:
    """``2 x 8 h100``, ``4 tpu v5p-8``, ``cpu``: what a job asks for, in a few characters."""
    resources = spec.get("resources") or {}
    device = resources.get("device") or {}
    kind, variant, count = device.get("type", "cpu"), device.get("variant", "auto"), int(device.get("count") or 0)
    replicas = int(resources.get("replicas") or 1)
    what = kind if variant in ("", "auto") else (variant if kind == "gpu" else f"{kind} {variant}")
    if count:
        what = f"{count} {what}"
    return f"{replicas} x {what}" if replicas > 1 else what


def job_view(job: JobRecord, now_ms: int) -> dict[str, Any]:
    """A job as a row of the jobs table."""
    origin = None
    if job.origin is not None:
        origin = {
            "dag_id": job.origin.dag_id,
            "run_id": job.origin.run_id,
            "task_id": job.origin.task_id,
            "map_index": job.origin.map_index,
        }
    return {
        "job_id": job.job_id,
        "direction": job.direction.value,
        "state": job.state.value,
        "handoff_state": job.handoff_state.value if job.handoff_state else None,
        "peer_id": job.peer_id,
        "backend_id": job.backend_id,
        "priority_band": job.priority_band,
        "submitter": job.submitting_user,
        "resources": resources_summary(job.spec),
        "submitted_at_ms": job.submitted_at_ms,
        "age_ms": max(0, now_ms - job.submitted_at_ms),
        "started_at_ms": job.started_at_ms,
        "finished_at_ms": job.finished_at_ms,
        "pending_reason": job.pending_reason,
        "error": job.error,
        "exit_code": job.exit_code,
        "cancel_requested": job.cancel_requested,
        "dag_id": job_dag_id(job),
        "origin": origin,
        "task_instance_path": task_instance_path(job),
    }


def _redacted_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as shown: workdir files by size only (they can be large, and bytes read badly)."""
    shown = dict(spec)
    files = shown.get("files") or {}
    shown["files"] = {name: f"{len(content)} characters" for name, content in files.items()}
    return shown


def describe_job(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
    """A job with its spec, its history of transitions, every pending reason it went through and its output tail."""
    events = federation.store.events(job.job_id)
    view = job_view(job, now_ms)
    view.update(
        owner_principal=job.owner_principal,
        nonce=job.nonce,
        scheduling_deadline_ms=job.scheduling_deadline_ms,
        reported_at_ms=job.reported_at_ms,
        updated_at_ms=job.updated_at_ms,
        delivery_attempts=job.delivery_attempts,
        next_delivery_at_ms=job.next_delivery_at_ms,
        last_delivery_error=job.last_delivery_error,
        requeue_count=job.requeue_count,
        avoided_peers=job.avoided_peer_ids(now_ms),
        spec=_redacted_spec(job.spec),
        events=[
            {
                "seq": e.seq,
                "at_ms": e.at_ms,
                "kind": e.kind,
                "state": e.state,
                "handoff_state": e.handoff_state,
                "peer_id": e.peer_id,
                "detail": e.detail,
            }
            for e in events
        ],
        pending_reasons=pending_reason_history(job.direction, events),
        output_tail=output_tail(federation, job.job_id),
    )
    return view


def output_tail(federation: Federation, job_id: str, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    query = sa.select(job_logs.c.line).where(job_logs.c.job_id == job_id).order_by(job_logs.c.seq.desc()).limit(lines)
    with federation.store.engine.connect() as connection, connection.begin():
        return [row[0] for row in connection.execute(query)][::-1]


def explain_job(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
    """What ``job`` waits for: for a queued job, every peer and backend as the placement pass sees them now."""
    base: dict[str, Any] = {
        "job_id": job.job_id,
        "state": job.state.value,
        "handoff_state": job.handoff_state.value if job.handoff_state else None,
        "pending_reason": job.pending_reason,
    }
    if job.terminal:
        outcome = f"It finished: {job.state.value}" + (f" ({job.error})" if job.error else "") + "."
        return {**base, "status": "finished", "summary": outcome}
    if job.cancel_requested:
        return {**base, "status": "cancelling", "summary": "A cancel was requested; it is re-sent until confirmed."}
    if job.direction is not Direction.SENT:
        where = f"local backend {job.backend_id}" if job.backend_id else "this cluster"
        if job.state is JobState.RUNNING:
            return {**base, "status": "running", "summary": f"It runs on {where}."}
        return {**base, "status": "local", "summary": f"It waits in the queue of {where} for free slots."}
    if job.handoff_state is HandoffState.PENDING:
        summary = f"Promoted to {job.peer_id}/{job.backend_id or '(any backend)'}; being delivered"
        if job.delivery_attempts:
            summary += f" (attempt {job.delivery_attempts + 1}; last error: {job.last_delivery_error})"
        return {**base, "status": "delivering", "summary": summary + "."}
    if job.handoff_state is not HandoffState.QUEUED:
        running = job.state is JobState.RUNNING
        summary = f"It runs on peer {job.peer_id}." if running else f"{job.pending_reason}."
        return {**base, "status": "on_peer", "summary": summary}
    return {**base, **_explain_queued(federation, job, now_ms)}


def _explain_queued(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
    queued = federation.store.queued_jobs()
    candidates = federation.candidates(queued, now_ms)
    mine = next((c for c in candidates if c.job_id == job.job_id), None)
    if mine is None:  # promoted or cancelled since it was read
        return {"status": "changed", "summary": "It changed while being explained; reload."}
    peers: list[PeerState] = federation.peer_states()
    settings = federation.settings
    result = plan(
        candidates,
        peers,
        federation.store.ledger(),
        now_ms=now_ms,
        max_per_peer=settings.max_handoffs_per_cycle,
        staleness_ms=federation.staleness_ms,
    )
    ahead = sum(1 for c in candidates if c.queue_key() < mine.queue_key())
    detail = explain(
        mine,
        peers,
        result,
        now_ms=now_ms,
        staleness_ms=federation.staleness_ms,
        max_per_peer=settings.max_handoffs_per_cycle,
    )
    _mark_unreadable_paths(detail, job, peers)
    explanation = {"jobs_ahead": ahead, "queued_jobs": len(candidates), **detail}
    if mine.expired(now_ms):
        summary = "Its scheduling deadline has passed: the next tick ends it as unschedulable."
        return {"status": "expiring", "summary": summary, "explanation": explanation}
    promotion = next((p for p in result.promotions if p.job_id == job.job_id), None)
    if promotion is not None:
        target = f"{promotion.peer_id}/{promotion.backend_id or '(any backend)'}"
        how = " by reclaiming capacity held by lower bands" if promotion.preempts else ""
        summary = f"It fits now on {target}{how}: the next placement tick promotes it."
        return {"status": "placeable", "summary": summary, "explanation": explanation}
    return {"status": "waiting", "summary": detail["summary"], "explanation": explanation}


def _mark_unreadable_paths(detail: dict[str, Any], job: JobRecord, peers: list[PeerState]) -> None:
    """On each backend row, the object-store paths of the job that backend could not read."""
    advertised = {(p.peer_id, b.backend_id): b.advertised for p in peers for b in p.backends}
    spec = job.job_spec
    for peer_row in detail["peers"]:
        for row in peer_row["backends"]:
            paths = unreadable_paths(spec, advertised.get((peer_row["peer_id"], row["backend_id"]), {}))
            if paths:
                row["unreadable_paths"] = [f"{path.where}={path.uri}" for path in paths]


def cancel_job(federation: Federation, job_id: str, now_ms: int) -> dict[str, Any]:
    """Cancel through the federation service and say what happened.

    ``result``: ``cancelled`` (ended now: it had not reached a peer), ``cancel_requested`` (sent to
    whoever runs it; it ends when they confirm), ``already_finished`` or ``not_found``.
    """
    outcome = federation.cancel(job_id)
    job = federation.store.get_job(job_id)
    if not outcome.found or job is None:
        return {"job_id": job_id, "result": "not_found", "message": f"Job {job_id} not found", "job": None}
    if outcome.was_terminal:
        result, message = "already_finished", f"Job {job_id} already finished ({job.state.value}); nothing to cancel"
    elif outcome.killed:
        result, message = "cancelled", job.error or "Cancelled"
    elif outcome.notify_peer:
        result, message = (
            "cancel_requested",
            f"Cancel sent to peer {outcome.notify_peer}; it ends when the peer confirms",
        )
    else:
        where = f"local backend {job.backend_id}" if job.backend_id else "its backend"
        result, message = "cancel_requested", f"Cancel sent to {where}; it ends when the backend confirms"
    return {"job_id": job_id, "result": result, "message": message, "job": job_view(job, now_ms)}

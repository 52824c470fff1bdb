"""The jobs read model: a job as a table row, a job's details (history, pending reasons, output
tail) and the explanation of what it waits for. Read-only.

Nothing here knows Airflow: the DAG a job belongs to and its task instance's UI path are added by
the Airflow surface (``plugins/job_documents.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa

from iris_airflow_provider.core.fit import never_fits
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.core.waiting import explain_waiting
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.placement import placement_snapshot
from iris_airflow_provider.store.records import JobRecord, current_incarnation, pending_reason_history, replica_values
from iris_airflow_provider.store.schema import job_logs

OUTPUT_TAIL_LINES = 100


def resources_summary(spec: Mapping[str, Any]) -> str:
    """``2 x 8 h100``, ``tpu v5p-16``, ``4 tpu``, ``cpu``: what a job asks for, in a few characters.
    A TPU slice's name says its size, so its per-host chip count is left out."""
    resources = spec.get("resources") or {}
    device = resources.get("device") or {}
    kind, variant, count = device.get("type", "cpu"), device.get("variant", "auto"), int(device.get("count") or 0)
    replicas = int(resources.get("replicas") or 1)
    concrete = variant not in ("", "auto")
    what = kind if not concrete else (variant if kind == "gpu" else f"{kind} {variant}")
    if count and not (kind == "tpu" and concrete):
        what = f"{count} {what}"
    return f"{replicas} x {what}" if replicas > 1 else what


def job_row(job: JobRecord, now_ms: int) -> dict[str, Any]:
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
        "origin": origin,
    }


def _redacted_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec as shown: workdir files by size only (they can be large, and bytes read badly)."""
    shown = dict(spec)
    files = shown.get("files") or {}
    shown["files"] = {name: f"{len(content)} characters" for name, content in files.items()}
    return shown


# Fields of the record that the details show as they are stored, in this order.
_DETAILED_AS_STORED = (
    "owner_principal",
    "nonce",
    "scheduling_deadline_ms",
    "reported_at_ms",
    "updated_at_ms",
    "delivery_attempts",
    "next_delivery_at_ms",
    "last_delivery_error",
    "requeue_count",
)


def job_details(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
    """A job's row with its spec, its history of transitions, every pending reason it went through
    and its output tail."""
    events = current_incarnation(federation.store.events(job.job_id))
    details = job_row(job, now_ms)
    details.update({name: getattr(job, name) for name in _DETAILED_AS_STORED})
    details.update(
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
        replicas=replica_values(job.replicas),
        children=job_tree(federation, job),
        output_tail=output_tail(federation, job),
    )
    return details


def job_tree(federation: Federation, job: JobRecord) -> list[dict[str, Any]]:
    """The jobs below ``job``, by id (a child before its own children): as its peer last reported
    them for a handed-off root, else as they run here."""
    if job.children:
        return [
            {"job_id": c["job_id"], "state": c["state"], "exit_code": c.get("exit_code"), "error": c.get("error", "")}
            for c in job.children
        ]
    return [
        {
            "job_id": child.job_spec.job_id,
            "state": child.state.value,
            "exit_code": child.exit_code,
            "error": child.error,
        }
        for child in federation.store.tree(job.job_id)
    ]


def output_tail(federation: Federation, job: JobRecord, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of the relayed output of the job's current incarnation, oldest first."""
    query = (
        sa.select(job_logs.c.line)
        .where(job_logs.c.job_id == job.job_id, job_logs.c.nonce == job.nonce)
        .order_by(job_logs.c.seq.desc())
        .limit(lines)
    )
    with federation.store.engine.connect() as connection, connection.begin():
        return [row[0] for row in connection.execute(query)][::-1]


def job_explanation(federation: Federation, job: JobRecord, now_ms: int) -> dict[str, Any]:
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
    snapshot = placement_snapshot(federation.store, federation.peers, now_ms)
    return {**base, **explain_waiting(job.job_spec, snapshot, federation.placement_rules)}


def never_fitting(federation: Federation, jobs: Iterable[JobRecord], now_ms: int) -> set[str]:
    """The queued jobs among ``jobs`` that no reachable backend could ever hold (their totals are all
    too small): they stay queued, and the Federation page marks them."""
    queued = [
        job
        for job in jobs
        if job.direction is Direction.SENT and job.handoff_state is HandoffState.QUEUED and not job.terminal
    ]
    if not queued:
        return set()
    peers = federation.heartbeats.configured_states()
    out = set()
    for job in queued:
        spec = job.job_spec
        too_big = never_fits(
            spec.gate,
            spec.routing,
            peers=peers,
            pinned_peer_id=spec.pin,
            now_ms=now_ms,
            staleness_ms=federation.staleness_ms,
        )
        if too_big is not None:
            out.add(job.job_id)
    return out

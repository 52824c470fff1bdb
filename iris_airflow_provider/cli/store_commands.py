"""The commands that read or drive the federation of the configured cluster, on its store:
``list-peers``, ``jobs``, ``describe``, ``explain`` and ``cancel``, run as ``airflow iris-federation
...``. Each returns a ``Report``: the UI API's document (``--output json|yaml``) and its tables.
The store and the federation are imported only when one of them runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from iris_airflow_provider.cli.output import Report, Table, age, attributes, band, capacity, iso


class NotFoundError(Exception):
    """A job the command names is not in the store (exit status 1)."""


def _federation(args: argparse.Namespace) -> Any:
    """The federation of the configured cluster, on the store named by --store-url or the Airflow connection."""
    import logging

    from iris_airflow_provider.cluster.build import build_federation
    from iris_airflow_provider.cluster.config import load_cluster_config
    from iris_airflow_provider.hooks.cluster_configuration import cluster_config

    # Airflow's logging writes to standard output, which --json keeps for the document alone.
    logging.getLogger("alembic").setLevel(logging.WARNING)

    # --cluster-config names a file; without it, Airflow's configuration says where the cluster's is.
    config = cluster_config() if args.cluster_config is None else load_cluster_config(args.cluster_config or None)
    if args.store_url:
        from iris_airflow_provider.hooks.federation_store import open_store

        store = open_store(args.store_url)
    else:
        from iris_airflow_provider.hooks.federation_store import FederationStoreHook
        from iris_airflow_provider.hooks.runtime import default_conn_id

        store = FederationStoreHook(args.conn_id or default_conn_id()).get_store()
    from iris_airflow_provider.hooks.federation_peer import peer_endpoints

    return build_federation(config, store, peer_endpoints(config))


def _now_ms() -> int:
    from iris_airflow_provider.backends.base import now_ms

    return now_ms()


def list_peers(args: argparse.Namespace) -> Report:
    from iris_airflow_provider.services.peer_views import peers_overview

    document = peers_overview(_federation(args), _now_ms())
    peers = []
    for peer in document["peers"]:
        health = "yes" if peer["reachable"] else ("stale" if peer["stale"] else ("lost" if peer["lost"] else "no"))
        heartbeat = age(peer["heartbeat_age_ms"]) + (" ago" if peer["heartbeat_age_ms"] is not None else "")
        lead = {
            "peer": peer["peer_id"],
            "kind": peer["kind"],
            "reachable": health,
            "heartbeat": heartbeat,
            "active": peer["active_federated_jobs"],
        }
        if not peer["backends"]:
            peers.append({**lead, "backend": "", "attributes": "", "capacity": peer["last_error"] or "no backends"})
        for backend in peer["backends"]:
            peers.append({**lead, "backend": backend["backend_id"], **_backend_columns(backend)})
    local = [
        {
            "backend": b["backend_id"],
            "kind": b["kind"],
            "running": b["running_task_count"],
            "pending": b["pending_task_count"],
            **_backend_columns(b),
        }
        for b in document["local_backends"]
    ]
    fleet = ", ".join(f"{v['variant']} {v['free']}/{v['total']}" for v in document["fleet"]) or "no device capacity"
    cluster = document["cluster"]
    return Report(
        document,
        [
            Table(peers, f"Peers of {cluster}:"),
            Table(local, f"Local backends of {cluster}:"),
            f"Fleet (local + reachable peers), free/total: {fleet}",
        ],
    )


def _backend_columns(backend: dict[str, Any]) -> dict[str, str]:
    return {"attributes": attributes(backend), "capacity": capacity(backend)}


def jobs(args: argparse.Namespace) -> Report:
    from iris_airflow_provider.core.states import Direction, JobState
    from iris_airflow_provider.plugins.job_documents import job_row_document
    from iris_airflow_provider.store.queries import JobFilter, MonitoringQueries

    federation = _federation(args)
    job_filter = JobFilter(
        states=tuple(JobState(s) for s in args.state or ()),
        directions=tuple(Direction(d) for d in args.direction or ()),
        peer_id=args.peer,
        submitter=args.submitter,
        dag_id=args.dag_id,
        job_id_contains=args.contains,
        active=True if args.active else None,
    )
    page = MonitoringQueries(federation.store).list_jobs(job_filter, limit=args.limit, offset=args.offset)
    now = _now_ms()
    views = [job_row_document(job, now) for job in page.jobs]
    rows = [
        {
            "job": v["job_id"],
            "state": v["state"],
            "handoff": v["handoff_state"],
            "peer": v["peer_id"] or ("(local)" if v["direction"] == "local" else ""),
            "backend": v["backend_id"],
            "band": band(v["priority_band"]),
            "request": v["resources"],
            "submitter": v["submitter"],
            "age": age(v["age_ms"]),
            "why": v["pending_reason"] or v["error"],
        }
        for v in views
    ]
    shown = f"{page.offset + 1}-{page.offset + len(views)}" if views else "0"
    more = f" (--offset {page.offset + len(views)} for more)" if page.offset + len(views) < page.total else ""
    return Report(
        {"jobs": views, "total": page.total, "limit": page.limit, "offset": page.offset},
        [Table(rows), f"{shown} of {page.total} job(s){more}"],
    )


def _job_document(args: argparse.Namespace, read: Callable[[Any, Any, int], dict[str, Any]]) -> dict[str, Any]:
    """``read(federation, job, now_ms)`` for the job the command names."""
    federation = _federation(args)
    job = federation.store.get_job(args.job)
    if job is None:
        raise NotFoundError(f"job {args.job} not found")
    return read(federation, job, _now_ms())


def describe(args: argparse.Namespace) -> Report:
    from iris_airflow_provider.plugins.job_documents import job_details_document

    details = _job_document(args, job_details_document)
    origin = details["origin"]
    fields = [
        ("job", details["job_id"]),
        ("state", details["state"] + (f" (handoff {details['handoff_state']})" if details["handoff_state"] else "")),
        ("why", details["pending_reason"] or details["error"]),
        ("direction", details["direction"]),
        ("peer/backend", f"{details['peer_id'] or '-'}/{details['backend_id'] or '-'}"),
        ("band", band(details["priority_band"])),
        ("request", details["resources"]),
        ("submitter", details["submitter"]),
        ("age", age(details["age_ms"])),
        ("exit code", details["exit_code"]),
        ("task", f"{origin['dag_id']} / {origin['run_id']} / {origin['task_id']}" if origin else None),
    ]
    parts: list[Table | str] = [
        Table([{"field": k, "value": v} for k, v in fields if v not in (None, "")]),
        Table(
            [
                {
                    "at": iso(e["at_ms"]),
                    "event": e["kind"],
                    "state": e["state"],
                    "handoff": e["handoff_state"],
                    "peer": e["peer_id"],
                    "detail": e["detail"],
                }
                for e in details["events"]
            ],
            "History:",
        ),
    ]
    if details["replicas"]:
        replicas = [
            {"replica": r["index"], "state": r["state"], "exit code": r["exit_code"]} for r in details["replicas"]
        ]
        parts.append(Table(replicas, "Replicas:"))
    if details.get("children"):
        children = [
            {"child": c["job_id"], "state": c["state"], "exit code": c["exit_code"], "error": c["error"]}
            for c in details["children"]
        ]
        parts.append(Table(children, "Children (its tree runs on one cluster):"))
    if details["pending_reasons"]:
        parts.append("Pending reasons: " + " -> ".join(details["pending_reasons"]))
    if details["output_tail"]:
        parts.append("Latest output:\n" + "\n".join("  " + line for line in details["output_tail"]))
    return Report(details, parts)


def explain(args: argparse.Namespace) -> Report:
    from iris_airflow_provider.services.job_views import job_explanation

    explained = _job_document(args, job_explanation)
    parts: list[Table | str] = [
        f"{explained['job_id']}: {explained['pending_reason'] or explained['state']}\n{explained['summary']}"
    ]
    detail = explained.get("explanation")
    if detail:
        gate = ", ".join(f"{n} {t}" for t, n in detail["gate"].items()) or "nothing gated"
        parts.append(
            f"Needs {gate} on one backend; routing: {', '.join(detail['constraints']) or 'none'}; "
            f"band {band(detail['band'])}; {detail['jobs_ahead']} queued job(s) ahead of it."
        )
        rows = []
        for peer in detail["peers"]:
            lead = {"peer": peer["peer_id"], "status": peer["status"]}
            if not peer["backends"]:
                empty = dict.fromkeys(("shape", "free", "reclaimable", "fits", "note"), "")
                rows.append({**lead, "backend": "(no backends)", **empty})
            for b in peer["backends"]:
                amounts = b.get("capacity") or ", ".join(f"{n} {t}" for t, n in b.get("free", {}).items())
                rows.append(
                    {
                        **lead,
                        "backend": b["backend_id"],
                        "shape": "matches" if b["shape_matches"] else "needs " + ", ".join(b["unmet"]),
                        "free": amounts,
                        "reclaimable": ", ".join(f"{n} {t}" for t, n in b.get("reclaimable", {}).items()),
                        "fits": {True: "yes", False: "no"}.get(b.get("fits")),
                        "note": _backend_note(b),
                    }
                )
        parts.append(Table(rows))
    return Report(explained, parts)


def _backend_note(row: dict[str, Any]) -> str:
    """What else keeps capacity on this backend from the job: reservations and a hold."""
    notes = []
    if row.get("reserved"):
        reserved = ", ".join(f"{n} {t}" for t, n in row["reserved"].items())
        notes.append(f"{reserved} {row['reserved_note']}")
    if row.get("hold"):
        notes.append(row["hold"])
    return "; ".join(notes)


def cancel(args: argparse.Namespace) -> Report:
    """Exit status 1 for a job already finished (nothing was cancelled)."""
    from iris_airflow_provider.plugins.job_documents import cancel_document

    federation = _federation(args)
    answer = cancel_document(federation.cancels.cancel_with_answer(args.job), _now_ms())
    if answer["result"] == "not_found":
        raise NotFoundError(answer["message"])
    row = {"job": args.job, "result": answer["result"].replace("_", " "), "message": answer["message"]}
    return Report(answer, [Table([row])], exit_code=1 if answer["result"] == "already_finished" else 0)

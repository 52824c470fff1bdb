"""The commands that read or drive the federation of the configured cluster, on its store:
``list-peers``, ``jobs``, ``describe``, ``explain`` and ``cancel``. Airflow and the store are
imported only when one of them runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from iris_airflow_provider.cli.output import age, attributes, band, capacity, emit, iso, table


class NotFoundError(Exception):
    """A job the command names is not in the store (exit status 1)."""


def _federation(args: argparse.Namespace) -> Any:
    """The federation of the configured cluster, on the store named by --store-url or the Airflow connection."""
    import logging

    from iris_airflow_provider.cluster.build import build_federation
    from iris_airflow_provider.cluster.config import load_cluster_config
    from iris_airflow_provider.hooks.runtime import cluster_config

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


def list_peers(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.services.peer_views import peers_overview

    document = peers_overview(_federation(args), _now_ms())
    if args.json:
        emit(stdout, document)
        return 0
    rows = []
    for peer in document["peers"]:
        health = "yes" if peer["reachable"] else ("stale" if peer["stale"] else ("lost" if peer["lost"] else "no"))
        heartbeat = age(peer["heartbeat_age_ms"]) + (" ago" if peer["heartbeat_age_ms"] is not None else "")
        first = [peer["peer_id"], peer["kind"], health, heartbeat, peer["active_federated_jobs"]]
        if not peer["backends"]:
            rows.append([*first, "", "", peer["last_error"] or "no backends reported"])
        for index, backend in enumerate(peer["backends"]):
            lead = first if index == 0 else ["", "", "", "", ""]
            rows.append([*lead, backend["backend_id"], attributes(backend), capacity(backend)])
    stdout.write(f"Peers of {document['cluster']}:\n")
    table(stdout, ["PEER", "KIND", "REACHABLE", "HEARTBEAT", "ACTIVE", "BACKEND", "ATTRIBUTES", "CAPACITY"], rows)
    stdout.write(f"\nLocal backends of {document['cluster']}:\n")
    table(
        stdout,
        ["BACKEND", "KIND", "RUNNING", "PENDING", "ATTRIBUTES", "CAPACITY"],
        [
            [b["backend_id"], b["kind"], b["running_task_count"], b["pending_task_count"], attributes(b), capacity(b)]
            for b in document["local_backends"]
        ],
    )
    fleet = ", ".join(f"{v['variant']} {v['free']}/{v['total']}" for v in document["fleet"]) or "no device capacity"
    stdout.write(f"\nFleet (local + reachable peers), free/total: {fleet}\n")
    return 0


def jobs(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
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
    if args.json:
        emit(stdout, {"jobs": views, "total": page.total, "limit": page.limit, "offset": page.offset})
        return 0
    rows = [
        [
            v["job_id"],
            v["state"],
            v["handoff_state"],
            v["peer_id"] or ("(local)" if v["direction"] == "local" else ""),
            v["backend_id"],
            band(v["priority_band"]),
            v["resources"],
            v["submitter"],
            age(v["age_ms"]),
            v["pending_reason"] or v["error"],
        ]
        for v in views
    ]
    table(stdout, ["JOB", "STATE", "HANDOFF", "PEER", "BACKEND", "BAND", "REQUEST", "SUBMITTER", "AGE", "WHY"], rows)
    shown = f"{page.offset + 1}-{page.offset + len(views)}" if views else "0"
    more = f" (--offset {page.offset + len(views)} for more)" if page.offset + len(views) < page.total else ""
    stdout.write(f"{shown} of {page.total} job(s){more}\n")
    return 0


def _job_document(args: argparse.Namespace, read: Callable[[Any, Any, int], dict[str, Any]]) -> dict[str, Any]:
    """``read(federation, job, now_ms)`` for the job the command names."""
    federation = _federation(args)
    job = federation.store.get_job(args.job)
    if job is None:
        raise NotFoundError(f"job {args.job} not found")
    return read(federation, job, _now_ms())


def describe(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.plugins.job_documents import job_details_document

    details = _job_document(args, job_details_document)
    if args.json:
        emit(stdout, details)
        return 0
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
    table(stdout, ["FIELD", "VALUE"], [[k, v] for k, v in fields if v not in (None, "")])
    stdout.write("\nHistory:\n")
    table(
        stdout,
        ["AT", "EVENT", "STATE", "HANDOFF", "PEER", "DETAIL"],
        [
            [iso(e["at_ms"]), e["kind"], e["state"], e["handoff_state"], e["peer_id"], e["detail"]]
            for e in details["events"]
        ],
    )
    if details["replicas"]:
        stdout.write("\nReplicas:\n")
        table(
            stdout,
            ["REPLICA", "STATE", "EXIT CODE"],
            [[r["index"], r["state"], "" if r["exit_code"] is None else r["exit_code"]] for r in details["replicas"]],
        )
    if details["pending_reasons"]:
        stdout.write("\nPending reasons: " + " -> ".join(details["pending_reasons"]) + "\n")
    if details["output_tail"]:
        stdout.write("\nLatest output:\n" + "\n".join("  " + line for line in details["output_tail"]) + "\n")
    return 0


def explain(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.services.job_views import job_explanation

    explained = _job_document(args, job_explanation)
    if args.json:
        emit(stdout, explained)
        return 0
    stdout.write(
        f"{explained['job_id']}: {explained['pending_reason'] or explained['state']}\n{explained['summary']}\n"
    )
    detail = explained.get("explanation")
    if detail:
        gate = ", ".join(f"{n} {t}" for t, n in detail["gate"].items()) or "nothing gated"
        stdout.write(
            f"\nNeeds {gate} on one backend; routing: {', '.join(detail['constraints']) or 'none'}; "
            f"band {band(detail['band'])}; {detail['jobs_ahead']} queued job(s) ahead of it.\n"
        )
        rows = []
        for peer in detail["peers"]:
            for index, b in enumerate(peer["backends"] or [None]):
                lead = [peer["peer_id"], peer["status"]] if index == 0 else ["", ""]
                if b is None:
                    rows.append([*lead, "(no backends)", "", "", "", "", ""])
                    continue
                amounts = b.get("capacity") or ", ".join(f"{n} {t}" for t, n in b.get("free", {}).items())
                reclaim = ", ".join(f"{n} {t}" for t, n in b.get("reclaimable", {}).items())
                shape = "matches" if b["shape_matches"] else "needs " + ", ".join(b["unmet"])
                fits = {True: "yes", False: "no"}.get(b.get("fits"))
                rows.append([*lead, b["backend_id"], shape, amounts, reclaim, fits, _backend_note(b)])
        table(stdout, ["PEER", "STATUS", "BACKEND", "SHAPE", "FREE", "RECLAIMABLE", "FITS", "NOTE"], rows)
    return 0


def _backend_note(row: dict[str, Any]) -> str:
    """What else keeps capacity on this backend from the job: reservations and a hold."""
    notes = []
    if row.get("reserved"):
        reserved = ", ".join(f"{n} {t}" for t, n in row["reserved"].items())
        notes.append(f"{reserved} {row['reserved_note']}")
    if row.get("hold"):
        notes.append(row["hold"])
    return "; ".join(notes)


def cancel(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.plugins.job_documents import cancel_document

    federation = _federation(args)
    answer = cancel_document(federation.cancels.cancel_with_answer(args.job), _now_ms())
    if answer["result"] == "not_found":
        raise NotFoundError(answer["message"])
    if args.json:
        emit(stdout, answer)
    else:
        stdout.write(f"{args.job}: {answer['result'].replace('_', ' ')}: {answer['message']}\n")
    return 1 if answer["result"] == "already_finished" else 0

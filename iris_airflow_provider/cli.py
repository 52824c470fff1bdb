"""The ``iris-federation`` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from iris_airflow_provider.federation.errors import SpecError


def _read_json(path: str, stdin: TextIO) -> Any:
    try:
        if path == "-":
            return json.load(stdin)
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SpecError.single("", f"{path} is not valid JSON: {error}") from None
    except OSError as error:
        raise SpecError.single("", f"cannot read {path}: {error.strerror}") from None


def _simulate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.federation.simulate import simulate

    result = simulate(_read_json(args.file, stdin), include_explanations=not args.no_explain)
    json.dump(result, stdout, indent=None if args.compact else 2)
    stdout.write("\n")
    return 0


def dag_bundle_config(dags_folder: bool = True) -> list[dict[str, Any]]:
    """The ``[dag_processor] dag_bundle_config_list`` that loads the provider's placement DAG."""
    from pathlib import Path

    import iris_airflow_provider

    bundle = {
        "name": "iris_federation",
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(Path(iris_airflow_provider.__file__).parent / "dags"), "refresh_interval": 300},
    }
    default = {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {}}
    return [default, bundle] if dags_folder else [bundle]


def _bundle(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    json.dump(dag_bundle_config(not args.without_dags_folder), stdout)
    stdout.write("\n")
    return 0


def _keygen(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    import os
    from pathlib import Path

    from iris_airflow_provider.peers.identity import generate_keypair

    private_pem, public_pem = generate_keypair()
    directory = Path(args.out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / f"{args.name}.key", directory / f"{args.name}.pub"
    if private_path.exists() and not args.force:
        raise SpecError.single("", f"{private_path} exists; pass --force to replace it")
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(private_pem)
    public_path.write_text(public_pem)
    stdout.write(
        f"private key: {private_path} (federation.private_key of cluster {args.name}; keep it secret)\n"
        f"public key:  {public_path} (give it to each peer: federation.trusted_peers.{args.name}.public_key)\n"
    )
    return 0


# Monitoring: list-peers, jobs, describe, explain, cancel ---------------------------------------------


class NotFoundError(Exception):
    """A job the command names is not in the store (exit status 1)."""


def _federation(args: argparse.Namespace) -> Any:
    """The federation of the configured cluster, on the store named by --store-url or the Airflow connection."""
    import logging

    from iris_airflow_provider.cluster.config import load_cluster_config
    from iris_airflow_provider.services.federation import Federation

    # Airflow's logging writes to standard output, which --json keeps for the document alone.
    logging.getLogger("alembic").setLevel(logging.WARNING)

    cluster_path = args.cluster_config
    if cluster_path is None:
        from iris_airflow_provider.runtime import cluster_config_path

        cluster_path = cluster_config_path()
    config = load_cluster_config(cluster_path or None)
    if args.store_url:
        from iris_airflow_provider.hooks.federation_store import open_store

        store = open_store(args.store_url)
    else:
        from iris_airflow_provider.hooks.federation_store import FederationStoreHook
        from iris_airflow_provider.runtime import default_conn_id

        store = FederationStoreHook(args.conn_id or default_conn_id()).get_store()
    return Federation.of(config, store)


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def _emit(stdout: TextIO, document: Any) -> None:
    json.dump(document, stdout, indent=2)
    stdout.write("\n")


def _table(stdout: TextIO, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; the last column is never padded."""
    cells = [[str(h) for h in headers], *[["-" if c in (None, "") else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        stdout.write(
            "  ".join(c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)).rstrip() + "\n"
        )


def _age(ms: int | None) -> str:
    if ms is None:
        return "never"
    seconds = max(0, ms // 1000)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 172_800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _band(wire: str) -> str:
    return wire.removeprefix("PRIORITY_BAND_").lower()


def _capacity(backend: dict[str, Any]) -> str:
    if backend.get("error"):
        return f"error: {backend['error']}"
    block = backend.get("availability")
    if block is None:
        return "not reported (shape only)"
    parts = []
    for variant in sorted(set(block.get("total_amounts") or {}) | set(block.get("amounts") or {})):
        free, total = (block.get("amounts") or {}).get(variant, 0), (block.get("total_amounts") or {}).get(variant, 0)
        held = [
            f"{_band(entry['band'])} {entry['amounts'][variant]}"
            for entry in block.get("held_by_band") or []
            if entry.get("amounts", {}).get(variant)
        ]
        parts.append(f"{variant} {free}/{total} free" + (f" (held: {', '.join(held)})" if held else ""))
    return "; ".join(parts) or "no device capacity"


def _attributes(backend: dict[str, Any]) -> str:
    return " ".join(f"{k}={','.join(map(str, v['values']))}" for k, v in backend["advertised_attributes"].items())


def _list_peers(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.monitoring import list_peers

    document = list_peers(_federation(args), _now_ms())
    if args.json:
        _emit(stdout, document)
        return 0
    rows = []
    for peer in document["peers"]:
        health = "yes" if peer["reachable"] else ("stale" if peer["stale"] else "no")
        heartbeat = _age(peer["heartbeat_age_ms"]) + (" ago" if peer["heartbeat_age_ms"] is not None else "")
        first = [peer["peer_id"], peer["kind"], health, heartbeat, peer["active_federated_jobs"]]
        if not peer["backends"]:
            rows.append([*first, "", "", peer["last_error"] or "no backends reported"])
        for index, backend in enumerate(peer["backends"]):
            lead = first if index == 0 else ["", "", "", "", ""]
            rows.append([*lead, backend["backend_id"], _attributes(backend), _capacity(backend)])
    stdout.write(f"Peers of {document['cluster']}:\n")
    _table(stdout, ["PEER", "KIND", "REACHABLE", "HEARTBEAT", "ACTIVE", "BACKEND", "ATTRIBUTES", "CAPACITY"], rows)
    stdout.write(f"\nLocal backends of {document['cluster']}:\n")
    _table(
        stdout,
        ["BACKEND", "KIND", "RUNNING", "PENDING", "ATTRIBUTES", "CAPACITY"],
        [
            [b["backend_id"], b["kind"], b["running_task_count"], b["pending_task_count"], _attributes(b), _capacity(b)]
            for b in document["local_backends"]
        ],
    )
    fleet = ", ".join(f"{v['variant']} {v['free']}/{v['total']}" for v in document["fleet"]) or "no device capacity"
    stdout.write(f"\nFleet (local + reachable peers), free/total: {fleet}\n")
    return 0


def _jobs(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.federation.states import Direction, JobState
    from iris_airflow_provider.monitoring import job_view
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
    views = [job_view(job, now) for job in page.jobs]
    if args.json:
        _emit(stdout, {"jobs": views, "total": page.total, "limit": page.limit, "offset": page.offset})
        return 0
    rows = [
        [
            v["job_id"],
            v["state"],
            v["handoff_state"],
            v["peer_id"] or ("(local)" if v["direction"] == "local" else ""),
            v["backend_id"],
            _band(v["priority_band"]),
            v["resources"],
            v["submitter"],
            _age(v["age_ms"]),
            v["pending_reason"] or v["error"],
        ]
        for v in views
    ]
    _table(stdout, ["JOB", "STATE", "HANDOFF", "PEER", "BACKEND", "BAND", "REQUEST", "SUBMITTER", "AGE", "WHY"], rows)
    shown = f"{page.offset + 1}-{page.offset + len(views)}" if views else "0"
    more = f" (--offset {page.offset + len(views)} for more)" if page.offset + len(views) < page.total else ""
    stdout.write(f"{shown} of {page.total} job(s){more}\n")
    return 0


def _get_job(federation: Any, job_id: str) -> Any:
    job = federation.store.get_job(job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


def _describe(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.monitoring import describe_job

    federation = _federation(args)
    described = describe_job(federation, _get_job(federation, args.job), _now_ms())
    if args.json:
        _emit(stdout, described)
        return 0
    origin = described["origin"]
    fields = [
        ("job", described["job_id"]),
        (
            "state",
            described["state"] + (f" (handoff {described['handoff_state']})" if described["handoff_state"] else ""),
        ),
        ("why", described["pending_reason"] or described["error"]),
        ("direction", described["direction"]),
        ("peer/backend", f"{described['peer_id'] or '-'}/{described['backend_id'] or '-'}"),
        ("band", _band(described["priority_band"])),
        ("request", described["resources"]),
        ("submitter", described["submitter"]),
        ("age", _age(described["age_ms"])),
        ("exit code", described["exit_code"]),
        ("task", f"{origin['dag_id']} / {origin['run_id']} / {origin['task_id']}" if origin else None),
    ]
    _table(stdout, ["FIELD", "VALUE"], [[k, v] for k, v in fields if v not in (None, "")])
    stdout.write("\nHistory:\n")
    _table(
        stdout,
        ["AT", "EVENT", "STATE", "HANDOFF", "PEER", "DETAIL"],
        [
            [_iso(e["at_ms"]), e["kind"], e["state"], e["handoff_state"], e["peer_id"], e["detail"]]
            for e in described["events"]
        ],
    )
    if described["pending_reasons"]:
        stdout.write("\nPending reasons: " + " -> ".join(described["pending_reasons"]) + "\n")
    if described["output_tail"]:
        stdout.write("\nLatest output:\n" + "\n".join("  " + line for line in described["output_tail"]) + "\n")
    return 0


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _explain(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.monitoring import explain_job

    federation = _federation(args)
    explained = explain_job(federation, _get_job(federation, args.job), _now_ms())
    if args.json:
        _emit(stdout, explained)
        return 0
    stdout.write(
        f"{explained['job_id']}: {explained['pending_reason'] or explained['state']}\n{explained['summary']}\n"
    )
    detail = explained.get("explanation")
    if detail:
        gate = ", ".join(f"{n} {t}" for t, n in detail["gate"].items()) or "nothing gated"
        stdout.write(
            f"\nNeeds {gate} on one backend; routing: {', '.join(detail['constraints']) or 'none'}; "
            f"band {_band(detail['band'])}; {detail['jobs_ahead']} queued job(s) ahead of it.\n"
        )
        rows = []
        for peer in detail["peers"]:
            for index, b in enumerate(peer["backends"] or [None]):
                lead = [peer["peer_id"], peer["status"]] if index == 0 else ["", ""]
                if b is None:
                    rows.append([*lead, "(no backends)", "", "", "", ""])
                    continue
                amounts = b.get("capacity") or ", ".join(f"{n} {t}" for t, n in b.get("free", {}).items())
                reclaim = ", ".join(f"{n} {t}" for t, n in b.get("reclaimable", {}).items())
                shape = "matches" if b["shape_matches"] else "needs " + ", ".join(b["unmet"])
                rows.append(
                    [*lead, b["backend_id"], shape, amounts, reclaim, {True: "yes", False: "no"}.get(b.get("fits"))]
                )
        _table(stdout, ["PEER", "STATUS", "BACKEND", "SHAPE", "FREE", "RECLAIMABLE", "FITS"], rows)
    return 0


def _cancel(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    from iris_airflow_provider.monitoring import cancel_job

    answer = cancel_job(_federation(args), args.job, _now_ms())
    if answer["result"] == "not_found":
        raise NotFoundError(answer["message"])
    if args.json:
        _emit(stdout, answer)
    else:
        stdout.write(f"{args.job}: {answer['result'].replace('_', ' ')}: {answer['message']}\n")
    return 1 if answer["result"] == "already_finished" else 0


def _store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")
    parser.add_argument(
        "--conn-id", help="Airflow connection of the federation store (default: [iris_federation] conn_id)"
    )
    parser.add_argument("--store-url", help="SQLAlchemy URL of the federation store (instead of the connection)")
    parser.add_argument(
        "--cluster-config", help="the cluster file (default: [iris_federation] cluster_config)", default=None
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iris-federation", description="Inspect and drive Iris job federation from the command line."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulate = commands.add_parser(
        "simulate",
        help="print what the federation would do with a given state (JSON in, JSON out)",
        description="Read one JSON state (local backends, peers, jobs, ledger) and print the decisions, "
        "promotions, pending reasons, expired jobs and updated ledger of one placement tick.",
    )
    simulate.add_argument("file", help="input JSON file, or - for standard input")
    simulate.add_argument("--no-explain", action="store_true", help="leave out pending jobs' explanations")
    simulate.add_argument("--compact", action="store_true", help="print the JSON on one line")
    simulate.set_defaults(run=_simulate)
    bundle = commands.add_parser(
        "dag-bundle-config",
        help="print the dag_bundle_config_list that loads the placement DAG shipped in this package",
        description="Print a value for AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST: the usual dags folder plus "
        "the bundle holding iris_federation_tick.",
    )
    bundle.add_argument("--without-dags-folder", action="store_true", help="only the provider's bundle")
    bundle.set_defaults(run=_bundle)
    keygen = commands.add_parser(
        "keygen",
        help="create this cluster's Ed25519 key pair for signed peer identity",
        description="Write NAME.key (private, mode 600) and NAME.pub into DIR.",
    )
    keygen.add_argument("--name", required=True, help="this cluster's name (the cluster file's name)")
    keygen.add_argument("--out-dir", default=".", help="where to write the keys (default: .)")
    keygen.add_argument("--force", action="store_true", help="replace existing keys")
    keygen.set_defaults(run=_keygen)

    from iris_airflow_provider.federation.states import Direction, JobState

    peers = commands.add_parser(
        "list-peers",
        help="which peers are reachable, what each advertises and how much is free",
        description="Peers as last heartbeated (list-peers shape with --json), this cluster's backends and the "
        "fleet's free/total per device variant.",
    )
    _store_options(peers)
    peers.set_defaults(run=_list_peers)
    jobs = commands.add_parser(
        "jobs", help="federated jobs, newest first, with their pending reasons", description="List jobs (paged)."
    )
    _store_options(jobs)
    jobs.add_argument("--state", action="append", choices=[s.value for s in JobState], help="repeatable")
    jobs.add_argument("--direction", action="append", choices=[d.value for d in Direction], help="repeatable")
    jobs.add_argument("--peer", help="peer id ('' for jobs without one)")
    jobs.add_argument("--submitter", help="the submitting user")
    jobs.add_argument("--dag-id", help="the DAG that submitted them")
    jobs.add_argument("--contains", help="part of the job id")
    jobs.add_argument("--active", action="store_true", help="only jobs not finished")
    jobs.add_argument("--limit", type=_bounded_int("--limit", 1, 10_000), default=50, help="1..10000 (default 50)")
    jobs.add_argument("--offset", type=_bounded_int("--offset", 0, 10_000_000), default=0)
    jobs.set_defaults(run=_jobs)
    for name, run, text in (
        ("describe", _describe, "a job: where it is, its history of transitions, pending reasons, latest output"),
        ("explain", _explain, "why a job waits: every peer and backend, free and reclaimable capacity"),
        ("cancel", _cancel, "cancel a job (before handoff it never reaches a peer)"),
    ):
        command = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        command.add_argument("job", metavar="JOB", help="the job id, e.g. /alice/train.run.manual__...")
        _store_options(command)
        command.set_defaults(run=run)
    return parser


def _bounded_int(name: str, low: int, high: int) -> Any:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Airflow (imported by most commands) logs to standard output; commands write their result to
        # ``stdout`` only, so that ``--json`` output is one clean document.
        with contextlib.redirect_stdout(sys.stderr):
            code: int = args.run(args, stdin, stdout)
    except SpecError as error:
        print(f"iris-federation {args.command}: invalid input\n{error}", file=sys.stderr)
        return 2
    except NotFoundError as error:
        print(f"iris-federation {args.command}: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())

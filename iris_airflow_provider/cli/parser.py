"""The ``iris-federation`` command line's arguments: one subcommand per command module function."""

from __future__ import annotations

import argparse
from typing import Any

from iris_airflow_provider.cli import offline, store_commands


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
        description="Read one JSON state (local backends, peers, jobs, ledger, reserve_after_ms) and print the "
        "decisions, promotions, pending reasons, expired jobs, updated ledger and reservations (backends held for "
        "starving jobs) of one placement tick.",
    )
    simulate.add_argument("file", help="input JSON file, or - for standard input")
    simulate.add_argument("--no-explain", action="store_true", help="leave out pending jobs' explanations")
    simulate.add_argument("--compact", action="store_true", help="print the JSON on one line")
    simulate.set_defaults(run=offline.simulate)
    bundle = commands.add_parser(
        "dag-bundle-config",
        help="print the dag_bundle_config_list that also loads the DAGs shipped in this package",
        description="Print a value for AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST: the current "
        "[dag_processor] dag_bundle_config_list (from the environment, airflow.cfg or Airflow's default, the dags "
        "folder) with the bundle holding iris_federation_tick added. Bundles already there (a GitDagBundle, say) are "
        "kept; an earlier iris_federation bundle is replaced, so running it again changes nothing.",
    )
    bundle.add_argument(
        "--provider-bundle-only",
        "--without-dags-folder",
        action="store_true",
        help="print only the provider's bundle, not merged with the current configuration",
    )
    bundle.set_defaults(run=offline.bundle)
    keygen = commands.add_parser(
        "keygen",
        help="create this cluster's Ed25519 key pair for signed peer identity",
        description="Write NAME.key (private, mode 600) and NAME.pub into DIR.",
    )
    keygen.add_argument("--name", required=True, help="this cluster's name (the cluster file's name)")
    keygen.add_argument("--out-dir", default=".", help="where to write the keys (default: .)")
    keygen.add_argument("--force", action="store_true", help="replace existing keys")
    keygen.set_defaults(run=offline.keygen)

    from iris_airflow_provider.core.states import Direction, JobState

    peers = commands.add_parser(
        "list-peers",
        help="which peers are reachable, what each advertises and how much is free",
        description="Peers as last heartbeated (list-peers shape with --json), this cluster's backends and the "
        "fleet's free/total per device variant.",
    )
    _store_options(peers)
    peers.set_defaults(run=store_commands.list_peers)
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
    jobs.set_defaults(run=store_commands.jobs)
    for name, run, text in (
        (
            "describe",
            store_commands.describe,
            "a job: where it is, its history of transitions, pending reasons, latest output",
        ),
        ("explain", store_commands.explain, "why a job waits: every peer and backend, free and reclaimable capacity"),
        ("cancel", store_commands.cancel, "cancel a job (before handoff it never reaches a peer)"),
    ):
        command = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        command.add_argument("job", metavar="JOB", type=_job_id, help="the job id, e.g. /alice/train.run.manual__...")
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


def _job_id(raw: str) -> str:
    from iris_airflow_provider.core.job_ids import JobIdError, check_job_key

    try:
        return check_job_key(raw)
    except JobIdError as error:
        raise argparse.ArgumentTypeError(f"JOB {error}") from None

"""The commands' names, help texts and arguments, declared once for both front ends.

``airflow iris-federation ...`` (``definition``) wraps each argument in Airflow's ``Arg``; the
stand-alone ``iris-federation`` (``parser``) adds the offline ones to a plain ``argparse`` parser,
without importing Airflow. An argument is ``(flags, keyword arguments of add_argument)``.
"""

from __future__ import annotations

import argparse
from typing import Any

from iris_airflow_provider.core.states import Direction, JobState

Argument = tuple[tuple[str, ...], dict[str, Any]]

GROUP_NAME = "iris-federation"
GROUP_HELP = "Inspect and drive Iris job federation: peers, jobs, why a job waits, cancels"

# name -> (help, description)
COMMANDS: dict[str, tuple[str, str]] = {
    "list-peers": (
        "Which peers are reachable, what each advertises and how much is free",
        "Peers as last heartbeated (the list-peers shape with --output json), this cluster's backends and the "
        "fleet's free/total per device variant.",
    ),
    "jobs": ("Federated jobs, newest first, with their pending reasons", "List jobs (paged), newest first."),
    "describe": (
        "A job: where it is, its history of transitions, pending reasons, latest output",
        "A job: where it is, its history of transitions, pending reasons, latest output.",
    ),
    "explain": (
        "Why a job waits: every peer and backend, free and reclaimable capacity",
        "Why a job waits: every peer and backend, free and reclaimable capacity.",
    ),
    "cancel": (
        "Cancel a job (before handoff it never reaches a peer)",
        "Cancel a job, as the Federation page's Cancel (before handoff it never reaches a peer). Exits 1 when the "
        "job had already finished.",
    ),
    "simulate": (
        "Print what the federation would do with a given state (JSON in)",
        "Read one JSON state (local backends, peers, jobs, ledger, reserve_after_ms) and print the decisions, "
        "promotions, pending reasons, expired jobs, updated ledger and reservations (backends held for starving "
        "jobs) of one placement tick.",
    ),
    "keygen": (
        "Create this cluster's Ed25519 key pair for signed peer identity",
        "Write NAME.key (private, mode 600) and NAME.pub into DIR.",
    ),
    "dag-bundle-config": (
        "Print the dag_bundle_config_list that also loads the DAGs shipped in this package",
        "Print a value for AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST: the current [dag_processor] "
        "dag_bundle_config_list (from the environment, airflow.cfg or Airflow's default, the dags folder) with the "
        "bundle holding iris_federation_tick added. Bundles already there (a GitDagBundle, say) are kept; an earlier "
        "iris_federation bundle is replaced, so running it again changes nothing.",
    ),
}
STORE_COMMANDS = ("list-peers", "jobs", "describe", "explain", "cancel")


def bounded_int(name: str, low: int, high: int) -> Any:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {value}")
        return value

    return parse


def job_id(raw: str) -> str:
    from iris_airflow_provider.core.job_ids import JobIdError, check_job_key

    try:
        return check_job_key(raw)
    except JobIdError as error:
        raise argparse.ArgumentTypeError(f"JOB {error}") from None


# The store commands' options --------------------------------------------------------------------------
CONN_ID: Argument = (
    ("--conn-id",),
    {"help": "Airflow connection of the federation store (default: [iris_federation] conn_id)"},
)
STORE_URL: Argument = (("--store-url",), {"help": "SQLAlchemy URL of the federation store (instead of the connection)"})
CLUSTER_CONFIG: Argument = (
    ("--cluster-config",),
    {"help": "the cluster file (default: [iris_federation] cluster_config)", "default": None},
)
STORE_OPTIONS = (CONN_ID, STORE_URL, CLUSTER_CONFIG)
JOB: Argument = (
    ("job",),
    {"metavar": "JOB", "type": job_id, "help": "the job id, e.g. /alice/train.run.manual__..."},
)
JOB_FILTERS: tuple[Argument, ...] = (
    (("--state",), {"action": "append", "choices": [s.value for s in JobState], "help": "repeatable"}),
    (("--direction",), {"action": "append", "choices": [d.value for d in Direction], "help": "repeatable"}),
    (("--peer",), {"help": "peer id ('' for jobs without one)"}),
    (("--submitter",), {"help": "the submitting user"}),
    (("--dag-id",), {"help": "the DAG that submitted them"}),
    (("--contains",), {"help": "part of the job id"}),
    (("--active",), {"action": "store_true", "help": "only jobs not finished"}),
    (("--limit",), {"type": bounded_int("--limit", 1, 10_000), "default": 50, "help": "1..10000 (default 50)"}),
    (("--offset",), {"type": bounded_int("--offset", 0, 10_000_000), "default": 0, "help": "default 0"}),
)

# The offline commands' arguments ----------------------------------------------------------------------
SIMULATE_FILE: Argument = (("file",), {"help": "input JSON file, or - for standard input"})
NO_EXPLAIN: Argument = (("--no-explain",), {"action": "store_true", "help": "leave out pending jobs' explanations"})
KEYGEN: tuple[Argument, ...] = (
    (("--name",), {"required": True, "help": "this cluster's name (the cluster file's name)"}),
    (("--out-dir",), {"default": ".", "help": "where to write the keys (default: .)"}),
    (("--force",), {"action": "store_true", "help": "replace existing keys"}),
)

"""The commands that need no federation store: ``simulate``, ``dag-bundle-config``, ``keygen``."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from iris_airflow_provider.cli.output import Report, Table, emit
from iris_airflow_provider.core.errors import SpecError


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


def simulated_tick(args: argparse.Namespace, stdin: TextIO) -> dict[str, Any]:
    from iris_airflow_provider.core.simulate import simulate as simulate_tick

    return simulate_tick(_read_json(args.file, stdin), include_explanations=not args.no_explain)


def simulate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    emit(stdout, simulated_tick(args, stdin), indent=None if args.compact else 2)
    return 0


def simulate_report(result: dict[str, Any]) -> Report:
    """The simulated tick's document, and a table for each of its non-empty lists (the JSON holds the rest)."""
    parts: list[Table | str] = [
        Table(
            [
                {"job": d["job_id"], "disposition": d["disposition"], "pinned to": d["pinned_peer_id"]}
                | {"why": d["reason"]}
                for d in result["decisions"]
            ],
            "Decisions:",
        )
    ]
    if result["promotions"]:
        promotions = [
            {"job": p["job_id"], "peer": p["peer_id"], "backend": p["backend_id"], "preempts": p["preempts"]}
            for p in result["promotions"]
        ]
        parts.append(Table(promotions, "Promotions:"))
    if result["pending"]:
        parts.append(Table([{"job": p["job_id"], "why": p["reason"]} for p in result["pending"]], "Pending:"))
    if result["expired"]:
        parts.append("Expired: " + ", ".join(result["expired"]))
    if result["reservations"]:
        reservations = [
            {"job": r["job_id"], "peer": r["peer_id"], "backend": r["backend_id"], "needs": _amounts(r["needs"])}
            for r in result["reservations"]
        ]
        parts.append(Table(reservations, "Backends held for starving jobs:"))
    return Report(result, parts)


def _amounts(amounts: dict[str, int]) -> str:
    return ", ".join(f"{count} {variant}" for variant, count in amounts.items())


BUNDLE_NAME = "iris_federation"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
BUNDLE_OPTION = "[dag_processor] dag_bundle_config_list"


def provider_bundle() -> dict[str, Any]:
    """The DAG bundle of the DAGs shipped in this package (the placement tick, the runner)."""
    from pathlib import Path

    import iris_airflow_provider

    path = str(Path(iris_airflow_provider.__file__).parent / "dags")
    return {"name": BUNDLE_NAME, "classpath": LOCAL_BUNDLE, "kwargs": {"path": path, "refresh_interval": 300}}


def merge_bundle_config(current: Any) -> list[dict[str, Any]]:
    """``current`` (a ``dag_bundle_config_list``: a Git bundle, the dags folder ...) with the
    provider's bundle added, or put in place of an earlier ``iris_federation`` bundle, so running
    the command again changes nothing."""
    if current in (None, ""):
        current = []
    if not isinstance(current, list) or not all(isinstance(item, dict) for item in current):
        raise SpecError.single(
            "", f"{BUNDLE_OPTION} must be a JSON list of bundle objects (name, classpath, kwargs), got {current!r}"
        )
    return [item for item in current if item.get("name") != BUNDLE_NAME] + [provider_bundle()]


def current_bundle_config() -> Any:
    """Airflow's ``dag_bundle_config_list`` as configured here (environment, airflow.cfg or its default)."""
    from airflow.configuration import conf

    try:
        return conf.getjson("dag_processor", "dag_bundle_config_list")
    except Exception as error:  # Airflow's message names the option and the bad JSON
        raise SpecError.single("", f"{BUNDLE_OPTION} is not valid JSON: {error}") from None


def dag_bundle_config(merge: bool = True) -> list[dict[str, Any]]:
    """The ``[dag_processor] dag_bundle_config_list`` that also loads the provider's DAGs: the current
    one merged with the provider's bundle (only the provider's bundle with ``merge=False``)."""
    return merge_bundle_config(current_bundle_config()) if merge else [provider_bundle()]


def bundle(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    emit(stdout, dag_bundle_config(merge=not args.provider_bundle_only), indent=None)
    return 0


def keygen(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
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

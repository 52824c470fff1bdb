"""The ``iris-federation`` command line."""

from __future__ import annotations

import argparse
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
    return parser


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args, stdin, stdout)
    except SpecError as error:
        print(f"iris-federation {args.command}: invalid input\n{error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())

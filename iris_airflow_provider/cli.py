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

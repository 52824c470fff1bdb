"""The command line: ``airflow iris-federation ...`` and the stand-alone ``iris-federation``.

``definition`` declares the Airflow CLI group (provider metadata ``cli``), ``airflow_commands`` runs
its commands; ``parser`` declares the stand-alone command (console script
``iris_airflow_provider.cli:main``), which needs no Airflow configuration. ``arguments`` holds what
both declare; ``offline`` runs the commands that need no store (simulate, dag-bundle-config,
keygen); ``store_commands`` those on the configured cluster's federation; ``output`` prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from iris_airflow_provider.cli.arguments import STORE_COMMANDS
from iris_airflow_provider.cli.offline import dag_bundle_config
from iris_airflow_provider.cli.parser import build_parser
from iris_airflow_provider.core.errors import SpecError

__all__ = ["build_parser", "dag_bundle_config", "main"]


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in STORE_COMMANDS:
        print(
            f"iris-federation {argv[0]}: this command reads the federation store of an Airflow deployment; "
            f"run it as `airflow iris-federation {argv[0]} ...`",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args, stdin, stdout)
    except SpecError as error:
        print(f"iris-federation {args.command}: invalid input\n{error}", file=sys.stderr)
        return 2
    return code

"""The ``iris-federation`` command line (console script ``iris_airflow_provider.cli:main``).

``parser`` declares the subcommands; ``offline`` runs those that need no store (simulate,
dag-bundle-config, keygen); ``store_commands`` those on the configured cluster's federation;
``output`` prints.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import TextIO

from iris_airflow_provider.cli.offline import dag_bundle_config
from iris_airflow_provider.cli.parser import build_parser
from iris_airflow_provider.cli.store_commands import NotFoundError
from iris_airflow_provider.core.errors import SpecError

__all__ = ["build_parser", "dag_bundle_config", "main"]


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

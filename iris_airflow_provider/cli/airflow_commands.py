"""What ``airflow iris-federation <command>`` runs: the command's report, printed in ``--output``
(``table``, ``json``, ``yaml`` or ``plain``) with Airflow's logs and warnings kept off standard output,
as Airflow's own listing commands do. An unknown job exits 1, invalid input 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from airflow.utils.cli import suppress_logs_and_warning
from airflow.utils.providers_configuration_loader import providers_configuration_loaded

from iris_airflow_provider.cli import offline, store_commands
from iris_airflow_provider.cli.output import Report, render
from iris_airflow_provider.cli.store_commands import NotFoundError
from iris_airflow_provider.core.errors import SpecError


def _run(name: str, command: Callable[[argparse.Namespace], Report], args: argparse.Namespace) -> None:
    try:
        report = command(args)
    except NotFoundError as error:
        raise SystemExit(f"airflow iris-federation {name}: {error}") from None
    except SpecError as error:
        print(f"airflow iris-federation {name}: invalid input\n{error}", file=sys.stderr)
        raise SystemExit(2) from None
    render(report, args.output)
    if report.exit_code:
        raise SystemExit(report.exit_code)


@suppress_logs_and_warning
@providers_configuration_loaded
def list_peers(args: argparse.Namespace) -> None:
    _run("list-peers", store_commands.list_peers, args)


@suppress_logs_and_warning
@providers_configuration_loaded
def jobs(args: argparse.Namespace) -> None:
    _run("jobs", store_commands.jobs, args)


@suppress_logs_and_warning
@providers_configuration_loaded
def describe(args: argparse.Namespace) -> None:
    _run("describe", store_commands.describe, args)


@suppress_logs_and_warning
@providers_configuration_loaded
def explain(args: argparse.Namespace) -> None:
    _run("explain", store_commands.explain, args)


@suppress_logs_and_warning
@providers_configuration_loaded
def cancel(args: argparse.Namespace) -> None:
    _run("cancel", store_commands.cancel, args)


@suppress_logs_and_warning
def simulate(args: argparse.Namespace) -> None:
    _run("simulate", lambda args: offline.simulate_report(offline.simulated_tick(args, sys.stdin)), args)


def keygen(args: argparse.Namespace) -> None:
    try:
        offline.keygen(args, sys.stdin, sys.stdout)
    except SpecError as error:
        print(f"airflow iris-federation keygen: invalid input\n{error}", file=sys.stderr)
        raise SystemExit(2) from None

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


def _store_command(name: str, command: Callable[[argparse.Namespace], Report]) -> Callable[[argparse.Namespace], None]:
    """A command on this deployment's store: it needs the providers' configuration ([iris_federation])."""

    @suppress_logs_and_warning
    @providers_configuration_loaded
    def run(args: argparse.Namespace) -> None:
        _run(name, command, args)

    return run


list_peers = _store_command("list-peers", store_commands.list_peers)
jobs = _store_command("jobs", store_commands.jobs)
describe = _store_command("describe", store_commands.describe)
explain = _store_command("explain", store_commands.explain)
cancel = _store_command("cancel", store_commands.cancel)


@suppress_logs_and_warning
def simulate(args: argparse.Namespace) -> None:
    _run("simulate", lambda args: offline.simulate_report(offline.simulated_tick(args, sys.stdin)), args)


def keygen(args: argparse.Namespace) -> None:
    try:
        offline.keygen(args, sys.stdin, sys.stdout)
    except SpecError as error:
        print(f"airflow iris-federation keygen: invalid input\n{error}", file=sys.stderr)
        raise SystemExit(2) from None

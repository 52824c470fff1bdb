"""The stand-alone ``iris-federation`` command: the commands that need neither Airflow's
configuration nor the federation store (``simulate``, ``keygen``, ``dag-bundle-config``), for
machines where Airflow is not configured. The others run as ``airflow iris-federation ...``
(``definition``)."""

from __future__ import annotations

import argparse

from iris_airflow_provider.cli import arguments, offline
from iris_airflow_provider.cli.arguments import COMMANDS, Argument


def _add(parser: argparse.ArgumentParser, *specs: Argument) -> None:
    for flags, options in specs:
        parser.add_argument(*flags, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iris-federation",
        description="Iris job federation without Airflow: simulate a placement tick, make peer keys, print the DAG "
        "bundle configuration. The commands on a deployment's federation (list-peers, jobs, describe, explain, "
        "cancel) are `airflow iris-federation ...`.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str) -> argparse.ArgumentParser:
        help_text, description = COMMANDS[name]
        return commands.add_parser(name, help=help_text[0].lower() + help_text[1:], description=description)

    simulate = command("simulate")
    _add(simulate, arguments.SIMULATE_FILE, arguments.NO_EXPLAIN)
    simulate.add_argument("--compact", action="store_true", help="print the JSON on one line")
    simulate.set_defaults(run=offline.simulate)
    bundle = command("dag-bundle-config")
    bundle.add_argument(
        "--provider-bundle-only",
        "--without-dags-folder",
        action="store_true",
        help="print only the provider's bundle, not merged with the current configuration",
    )
    bundle.set_defaults(run=offline.bundle)
    keygen = command("keygen")
    _add(keygen, *arguments.KEYGEN)
    keygen.set_defaults(run=offline.keygen)
    return parser

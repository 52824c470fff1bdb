"""``airflow iris-federation ...``: the provider's Airflow CLI group, named in provider metadata
(``get_provider_info()["cli"]``) and loaded by Airflow's CLI parser, like the cncf-kubernetes
provider's ``airflow kubernetes ...``. Commands are imported only when one runs."""

from __future__ import annotations

from airflow.cli.cli_config import ARG_OUTPUT, ARG_VERBOSE, ActionCommand, Arg, GroupCommand, lazy_load_command

from iris_airflow_provider.cli import arguments
from iris_airflow_provider.cli.arguments import COMMANDS, GROUP_HELP, GROUP_NAME, Argument

_COMMANDS_MODULE = "iris_airflow_provider.cli.airflow_commands"


def _args(*specs: Argument) -> tuple[Arg, ...]:
    return tuple(Arg(flags, **options) for flags, options in specs)


def _command(name: str, function: str, args: tuple[Arg, ...]) -> ActionCommand:
    help_text, description = COMMANDS[name]
    return ActionCommand(
        name=name,
        help=help_text,
        description=description,
        func=lazy_load_command(f"{_COMMANDS_MODULE}.{function}"),
        args=args,
    )


_STORE = _args(*arguments.STORE_OPTIONS)
_JOB = _args(arguments.JOB)

IRIS_FEDERATION_COMMANDS = (
    _command("list-peers", "list_peers", (*_STORE, ARG_OUTPUT, ARG_VERBOSE)),
    _command("jobs", "jobs", (*_args(*arguments.JOB_FILTERS), *_STORE, ARG_OUTPUT, ARG_VERBOSE)),
    _command("describe", "describe", (*_JOB, *_STORE, ARG_OUTPUT, ARG_VERBOSE)),
    _command("explain", "explain", (*_JOB, *_STORE, ARG_OUTPUT, ARG_VERBOSE)),
    _command("cancel", "cancel", (*_JOB, *_STORE, ARG_OUTPUT, ARG_VERBOSE)),
    _command("simulate", "simulate", (*_args(arguments.SIMULATE_FILE, arguments.NO_EXPLAIN), ARG_OUTPUT, ARG_VERBOSE)),
    _command("keygen", "keygen", (*_args(*arguments.KEYGEN), ARG_VERBOSE)),
)


def get_iris_federation_cli_commands() -> list[GroupCommand]:
    return [GroupCommand(name=GROUP_NAME, help=GROUP_HELP, subcommands=IRIS_FEDERATION_COMMANDS)]

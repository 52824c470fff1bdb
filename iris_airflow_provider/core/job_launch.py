"""What a job starts with, its command, image and environment, held to what a process can be
started with and to the names the backends keep for themselves.

- ``command``: at most 4096 arguments of at most 131071 bytes each (Linux's ``MAX_ARG_STRLEN``,
  less the NUL); free text (``core/characters.py``): tabs and newlines are fine, NUL and other
  control characters are not (``exec`` would cut the argument short at a NUL).
- ``image``: at most 1024 characters, no space or control character.
- ``env``: at most 1024 variables; names are letters, digits and ``_`` (not starting with a
  digit), at most 256 characters; values are free text; one variable at most 131071 bytes;
  command and env together at most 1 MiB (half the usual ``ARG_MAX``: the backend adds its own).
- Reserved: every name starting with ``IRIS_``. The backends set ``IRIS_JOB_ID``,
  ``IRIS_JOB_NONCE``, ``IRIS_NUM_REPLICAS``, ``IRIS_BACKEND_ID``, ``IRIS_REPLICA_INDEX``,
  ``IRIS_COORDINATOR_ADDRESS``, ``IRIS_DEVICE_VARIANT``, ``IRIS_DEVICE_SLOTS`` and ``IRIS_RESULT``; a
  job that set them could pass for another job or incarnation, or claim devices it was not given.
  The whole prefix is reserved (names are case-sensitive, so ``iris_x`` is the job's own) so that
  a variable a backend adds later never silently changes meaning for a job that already sets it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.characters import (
    describe_refused,
    refused_in_name,
    refused_in_text,
    utf8_length,
    value_problem,
)
from iris_airflow_provider.core.limits import (
    MAX_ARGUMENT_BYTES,
    MAX_ENV_NAME_LENGTH,
    MAX_EXEC_BYTES,
    MAX_IMAGE_LENGTH,
)

RESERVED_ENV_PREFIX = "IRIS_"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN = 5


def check_command(command: Sequence[str]) -> Sequence[str]:
    """``command`` when every argument can be passed to ``exec``, else an error naming each bad one."""
    problems = [f"argument {index} {problem}" for index, arg in enumerate(command) if (problem := _text_problem(arg))]
    if problems:
        raise PydanticCustomError("command", "{problems}", {"problems": _joined(problems)})
    return command


def check_image(image: str) -> str:
    """``image`` when it can be an image reference: no space or control character, not too long."""
    not_in_name = set(refused_in_name(image))
    refused = [c for c in dict.fromkeys(image) if c in not_in_name or c.isspace()]
    if refused:
        raise PydanticCustomError(
            "image",
            "must be an image reference without spaces or control characters; holds {bad}",
            {"bad": describe_refused(refused)},
        )
    if len(image) > MAX_IMAGE_LENGTH:
        raise PydanticCustomError("image", "must be at most {limit} characters", {"limit": MAX_IMAGE_LENGTH})
    return image


def check_env(env: Mapping[str, str], command: Sequence[str] | None) -> Mapping[str, str]:
    """``env`` when every name is valid and free and every value can be passed to ``exec``."""
    bad = sorted(name for name in env if not ENV_NAME.fullmatch(name) or len(name) > MAX_ENV_NAME_LENGTH)
    if bad:
        raise PydanticCustomError(
            "env_name",
            "invalid variable name(s) {bad}; names are letters, digits and _ (not first), at most {limit} characters",
            {"bad": ", ".join(repr(name[:40]) for name in bad[:_SHOWN]), "limit": MAX_ENV_NAME_LENGTH},
        )
    reserved = sorted(name for name in env if name.startswith(RESERVED_ENV_PREFIX))
    if reserved:
        raise PydanticCustomError(
            "env_reserved",
            "{names}: names starting with {prefix} are reserved for what the backend sets (the job's id, "
            "incarnation, replica and devices); use another name",
            {"names": ", ".join(reserved[:_SHOWN]), "prefix": RESERVED_ENV_PREFIX},
        )
    problems = [f"{name} {problem}" for name, value in env.items() if (problem := _variable_problem(name, value))]
    if problems:
        raise PydanticCustomError("env_value", "{problems}", {"problems": _joined(problems)})
    total = sum(utf8_length(arg) + 1 for arg in command or ()) + sum(
        utf8_length(f"{name}={value}") + 1 for name, value in env.items()
    )
    if total > MAX_EXEC_BYTES:
        raise PydanticCustomError(
            "exec_size",
            "command and env together hold {total} bytes; at most {limit} can start a process",
            {"total": total, "limit": MAX_EXEC_BYTES},
        )
    return env


def _text_problem(text: str) -> str | None:
    return value_problem(refused_in_text(text), utf8_length(text), MAX_ARGUMENT_BYTES, "bytes")


def _variable_problem(name: str, value: str) -> str | None:
    size = utf8_length(f"{name}={value}")
    return value_problem(refused_in_text(value), size, MAX_ARGUMENT_BYTES, "bytes with its name")


def _joined(problems: list[str]) -> str:
    more = len(problems) - _SHOWN
    return "; ".join(problems[:_SHOWN]) + (f" (and {more} more)" if more > 0 else "")

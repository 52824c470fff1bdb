"""One error for bad input that names every bad field, with paths like ``jobs[3].resources.device.count``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

_LONGEST_PART = 64


@dataclass(frozen=True, slots=True)
class FieldProblem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    """Invalid input. ``problems`` lists each bad field; the message lists them all, one per line."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, path: str, message: str) -> SpecError:
        return cls([FieldProblem(path, message)])

    @classmethod
    def from_validation_error(cls, error: ValidationError, prefix: str = "") -> SpecError:
        return cls.from_errors(error.errors(), prefix)

    @classmethod
    def from_errors(cls, errors: Iterable[Any], prefix: str = "") -> SpecError:
        """From pydantic's error dicts (``ValidationError.errors()``, or FastAPI's request errors)."""
        return cls([FieldProblem(join_path(prefix, _path(e["loc"])), _message(e)) for e in errors])


def join_path(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("function-"):  # pydantic's name for a validator step, not a field
            continue
        else:
            # A key of the input (an env name, a file name) may hold anything: escaped, and cut,
            # so the error is safe to log and to send as JSON.
            part = part if part.isprintable() and len(part) <= _LONGEST_PART else repr(part[:_LONGEST_PART])
            out = f"{out}.{part}" if out else part
    return out


def _message(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind in ("literal_error", "enum"):
        return f"must be one of: {ctx.get('expected', '')}".replace("'", "")
    if kind in ("int_type", "int_parsing", "int_from_float", "int_parsing_size"):
        return "must be an integer"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind in ("string_type",):
        return "must be a string"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if kind in ("list_type", "tuple_type"):
        return "must be a list"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be an object"
    if kind == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")

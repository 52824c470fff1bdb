"""A constraint as a job submits it (``{"key", "op", "values"}``, or ``value`` for one value),
validated and normalized into a :class:`~iris_airflow_provider.core.constraints.Constraint`.

Besides the registry's rules (``core/constraints.py``), what a job may send is bounded: a key and
a string value are names (``core/characters.py``) of at most 256 characters, a number is finite
and within ``±2**53`` (what every JSON reader keeps exactly), and a constraint has at most 256
values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.characters import refused_in_name, value_problem
from iris_airflow_provider.core.constraints import (
    Constraint,
    ConstraintError,
    Op,
    Scalar,
    check_key,
    check_op,
    check_values,
    normalize_value,
)
from iris_airflow_provider.core.limits import (
    MAX_CONSTRAINT_NUMBER,
    MAX_CONSTRAINT_VALUES,
    MAX_NAME_LENGTH,
    shown_number,
)
from iris_airflow_provider.core.strict_model import StrictModel

RawValue = str | int | float | bool
_LONGEST_OP = max(len(op.value) for op in Op)


class ConstraintSpec(StrictModel):
    """``{"key": ..., "op": ..., "values": [...]}`` as submitted; ``value`` is accepted for one value."""

    key: str
    op: Op
    values: tuple[RawValue, ...] = Field(default=(), max_length=MAX_CONSTRAINT_VALUES, validate_default=True)
    input_only_keys: ClassVar[tuple[str, ...]] = ("value",)

    @model_validator(mode="before")
    @classmethod
    def _single_value(cls, data: Any) -> Any:
        if isinstance(data, Constraint):
            return {"key": data.key, "op": data.op, "values": data.values}
        if isinstance(data, Mapping) and "value" in data and "values" in data:
            raise PydanticCustomError("value_and_values", "give value or values, not both")
        if isinstance(data, Mapping) and "value" in data:
            return {**{k: v for k, v in data.items() if k != "value"}, "values": [data["value"]]}
        return data

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        problem = _name_problem(value)
        if problem:
            raise PydanticCustomError("constraint_key", "must be an attribute name; {problem}", {"problem": problem})
        try:
            return check_key(value)
        except ConstraintError as error:
            raise PydanticCustomError("constraint_key", str(error)) from None

    @field_validator("op", mode="before")
    @classmethod
    def _op(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        op = value.strip()
        if len(op) > _LONGEST_OP:
            op = op[:_LONGEST_OP] + "..."  # never an op: refused, and the error quotes no more than this
        try:
            return check_op(info.data.get("key", ""), op)
        except ConstraintError as error:
            raise PydanticCustomError("constraint_op", str(error)) from None

    @field_validator("values")
    @classmethod
    def _values(cls, value: tuple[RawValue, ...], info: ValidationInfo) -> tuple[Scalar, ...]:
        problems = [f"value {i}: {problem}" for i, raw in enumerate(value) if (problem := _raw_value_problem(raw))]
        if problems:
            raise PydanticCustomError("constraint_values", "{problems}", {"problems": "; ".join(problems[:5])})
        if "key" not in info.data or "op" not in info.data:
            normalized = tuple(normalize_value(v) for v in value)
        else:
            try:
                normalized = check_values(info.data["key"], info.data["op"], value)
            except ConstraintError as error:
                raise PydanticCustomError("constraint_values", str(error)) from None
        for number in normalized:
            if not isinstance(number, str) and abs(number) > MAX_CONSTRAINT_NUMBER:
                raise PydanticCustomError(
                    "constraint_values",
                    "numbers must be between -{limit} and {limit}, got {got}",
                    {"limit": MAX_CONSTRAINT_NUMBER, "got": shown_number(number)},
                )
        return normalized

    def to_constraint(self) -> Constraint:
        return Constraint(self.key, self.op, self.values)  # already normalized by ``_values``


def _name_problem(value: str) -> str | None:
    return value_problem(refused_in_name(value), len(value), MAX_NAME_LENGTH, "characters")


def _raw_value_problem(raw: RawValue) -> str | None:
    if isinstance(raw, str):
        return _name_problem(raw)
    if isinstance(raw, float) and not math.isfinite(raw):
        return f"must be a finite number, got {raw}"
    return None

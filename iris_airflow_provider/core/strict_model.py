"""The base of every validated model (job specs, the cluster file, wire bodies): frozen, and an
unknown field is reported with every other problem, naming the accepted fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

_SHOWN_UNKNOWN = 20
_LONGEST_SHOWN = 64


class StrictModel(BaseModel):
    """Frozen, and an unknown field is an error that lists the accepted ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    # Input keys a subclass accepts besides its fields (its own before-validator rewrites them).
    input_only_keys: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _reject_unknown_fields(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        # Validate the known fields too, so unknown fields are reported with every other problem.
        if not isinstance(data, Mapping):
            return handler(data)
        accepted = [*cls.model_fields, *cls.input_only_keys]
        unknown = sorted(_shown(k) for k in data if k not in accepted)
        if not unknown:
            return handler(data)
        if len(unknown) > _SHOWN_UNKNOWN:
            unknown = [*unknown[:_SHOWN_UNKNOWN], f"and {len(unknown) - _SHOWN_UNKNOWN} more"]
        problems = [
            InitErrorDetails(
                type=PydanticCustomError(
                    "unknown_field",
                    "unknown field(s) {unknown}; accepted: {accepted}",
                    {"unknown": ", ".join(unknown), "accepted": ", ".join(accepted)},
                ),
                loc=(),
                input=data,
            )
        ]
        try:
            handler({k: v for k, v in data.items() if k in accepted})
        except ValidationError as error:
            problems += [
                InitErrorDetails(
                    type=PydanticCustomError(e["type"], e["msg"], e.get("ctx")), loc=e["loc"], input=e["input"]
                )
                for e in error.errors()
            ]
        raise ValidationError.from_exception_data(cls.__name__, problems)


def _shown(key: Any) -> str:
    """An unknown field's name as the error shows it: as given when short and printable, else escaped
    and cut (a name may hold anything, even a lone surrogate that cannot be printed at all)."""
    name = str(key)
    return name if name.isprintable() and len(name) <= _LONGEST_SHOWN else repr(name[:_LONGEST_SHOWN])

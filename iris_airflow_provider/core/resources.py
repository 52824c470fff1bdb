"""What a job asks for per replica: a device (type, variant, count), cpu and memory, and how many
replicas; each number held to its range in ``core/limits.py``.

The availability gate, ``replicas x count`` of a concrete GPU variant, is derived here too.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from iris_airflow_provider.core.characters import describe_refused, refused_in_name
from iris_airflow_provider.core.limits import CPU, DEVICES, MAX_NAME_LENGTH, MEMORY, REPLICAS, shown_number
from iris_airflow_provider.core.strict_model import StrictModel

DeviceType = Literal["cpu", "gpu", "tpu"]
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTP]i?|[kmgtp]i?|)?[bB]?")
_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "p": 10**15,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "pi": 2**50,
}


def parse_memory(raw: int | float | str) -> int:
    """Bytes from an integer or a quantity such as ``16Gi``, ``512Mi`` or ``2G``, within ``MEMORY``."""
    if isinstance(raw, bool):
        raise ValueError("must be bytes or a quantity such as 16Gi")
    if isinstance(raw, int | float):
        number: int | float = raw
    else:
        match = _QUANTITY.fullmatch(raw.strip())
        if not match:
            raise ValueError(f"must be bytes or a quantity such as 16Gi, 512Mi or 2G; got {raw[:40]!r}")
        number = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if isinstance(number, float) and not math.isfinite(number):
        raise MEMORY.refuse(shown_number(number))
    if number < 0:
        raise ValueError("must be >= 0")
    if number > MEMORY.high:
        raise MEMORY.refuse(shown_number(raw if isinstance(raw, int | float) else number))
    return int(number)


Replicas = Annotated[int, BeforeValidator(REPLICAS.check), Field(ge=REPLICAS.low)]
DeviceCount = Annotated[int, BeforeValidator(DEVICES.check), Field(ge=DEVICES.low)]
Cores = Annotated[float, BeforeValidator(CPU.check), Field(ge=CPU.low, allow_inf_nan=False)]


class DeviceSpec(StrictModel):
    type: DeviceType = "cpu"
    variant: str = "auto"
    count: DeviceCount = Field(default=0, validate_default=True)

    @field_validator("type", mode="before")
    @classmethod
    def _lower_type(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str, info: ValidationInfo) -> str:
        refused = refused_in_name(value)
        if refused:
            raise ValueError(f"must be a device variant such as h100 or v5p-8; holds {describe_refused(refused)}")
        value = value.strip().lower()
        if not value or len(value) > MAX_NAME_LENGTH:
            raise ValueError(
                f"must be a device variant such as h100 or v5p-8, or auto (1-{MAX_NAME_LENGTH} characters)"
            )
        if info.data.get("type") == "cpu" and value != "auto":
            raise ValueError("must be auto for a cpu device")
        return value

    @field_validator("count")
    @classmethod
    def _count(cls, value: int, info: ValidationInfo) -> int:
        kind = info.data.get("type")
        if kind == "cpu" and value != 0:
            raise ValueError("must be 0 for a cpu device")
        if kind in ("gpu", "tpu") and value < 1:
            raise ValueError(f"must be >= 1 for a {kind} device")
        return value


class Resources(StrictModel):
    device: DeviceSpec = DeviceSpec()
    replicas: Replicas = 1
    cpu: Cores = Field(default=0.0, description="cores per replica; 0 leaves it to the backend")
    memory: int = Field(default=0, ge=0, description="bytes per replica (accepts 16Gi, 512Mi, 2G)")

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return parse_memory(value) if isinstance(value, str | int | float) else value

    def gate(self) -> dict[str, int]:
        """The availability gate: ``replicas x count`` of a concrete GPU variant, else nothing.

        CPU, TPU and ``auto`` jobs are ungated, as in the reference. The whole job must fit on one
        backend, so all replicas count even when they are not co-scheduled.
        """
        device = self.device
        if device.type != "gpu" or device.variant == "auto":
            return {}
        return {device.variant: self.replicas * device.count}

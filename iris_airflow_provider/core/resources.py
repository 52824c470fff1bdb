"""What a job asks for per replica: a device (type, variant, count), cpu and memory, and how many
replicas; each number held to its range in ``core/limits.py``.

The availability gate is derived here too: the devices of a concrete variant, GPU or TPU, that all
replicas hold together. A TPU variant names a slice (``core/tpu.py``): it must be one the table
knows, ``count`` is its chips per host (the default; nothing else is accepted, a slice is taken
whole), and a replica is a whole slice, so it holds ``hosts x count`` chips.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from iris_airflow_provider.core.characters import describe_refused, refused_in_name
from iris_airflow_provider.core.limits import CPU, DEVICES, MAX_NAME_LENGTH, MEMORY, REPLICAS, shown_number
from iris_airflow_provider.core.strict_model import StrictModel
from iris_airflow_provider.core.tpu import UnknownTpuVariantError, tpu_slice

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
        if info.data.get("type") == "tpu" and value != "auto":
            try:
                return tpu_slice(value).variant
            except UnknownTpuVariantError as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("count")
    @classmethod
    def _count(cls, value: int, info: ValidationInfo) -> int:
        kind = info.data.get("type")
        if kind == "cpu" and value != 0:
            raise ValueError("must be 0 for a cpu device")
        variant = info.data.get("variant")
        if kind == "tpu":
            if not isinstance(variant, str):
                return value  # the variant is refused: its error says what to give
            if variant != "auto":
                per_host = tpu_slice(variant).chips_per_host
                if value not in (0, per_host):
                    raise ValueError(f"must be {per_host} for a {variant} (its chips per host; a slice is taken whole)")
                return per_host
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

    @property
    def hosts_per_replica(self) -> int:
        """The pods one replica runs as: a TPU slice's hosts, else one."""
        device = self.device
        if device.type == "tpu" and device.variant != "auto":
            return tpu_slice(device.variant).hosts
        return 1

    def gate(self) -> dict[str, int]:
        """The availability gate: ``replicas x hosts x count`` of a concrete GPU or TPU variant (a
        TPU replica is a whole slice of ``hosts`` hosts), else nothing.

        CPU and ``auto`` jobs are ungated, as in the reference; a concrete TPU variant is gated like
        a GPU variant (the reference leaves TPUs ungated). The whole job must fit on one backend, so
        all replicas count even when they are not co-scheduled.
        """
        device = self.device
        if device.type == "cpu" or device.variant == "auto":
            return {}
        return {device.variant: self.replicas * self.hosts_per_replica * device.count}

"""The job spec: what a user submits, validated once, before anything is written.

A job is a command and an image with resources (a device type and variant, a count per replica,
replicas, cpu, memory), constraints, a priority band, an optional pin to a peer
(``target_cluster``) and an optional scheduling deadline. Job ids are cluster-invariant:
``/<user>/<name>`` for a root job, with more path segments for its children.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.bands import DEFAULT_BAND, Band, UnknownBandError, parse_band
from iris_airflow_provider.core.constraints import (
    ANY_REGION,
    BACKEND_KEY,
    CLUSTER_KEY,
    Constraint,
    ConstraintError,
    Op,
    Scalar,
    check_key,
    check_op,
    check_values,
    device_constraints,
    directive,
    make_constraint,
    merge_constraints,
    normalize_value,
    routing_constraints,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.strict_model import StrictModel

_SEGMENT = r"[^/\s]+"
BASE64_PREFIX = "base64:"
MAX_FILES = 256
MAX_FILES_BYTES = 10 * 2**20  # what a handoff carries inline; anything bigger belongs in an object store
JOB_ID_PATTERN = re.compile(rf"/{_SEGMENT}(/{_SEGMENT})+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
DeviceType = Literal["cpu", "gpu", "tpu"]


def parse_memory(raw: int | float | str) -> int:
    """Bytes from an integer or a quantity such as ``16Gi``, ``512Mi`` or ``2G``."""
    if isinstance(raw, bool):
        raise ValueError("must be bytes or a quantity such as 16Gi")
    if isinstance(raw, int | float):
        if raw < 0:
            raise ValueError("must be >= 0")
        return int(raw)
    match = _QUANTITY.fullmatch(raw.strip())
    if not match:
        raise ValueError(f"must be bytes or a quantity such as 16Gi, 512Mi or 2G; got {raw!r}")
    number, unit = match.group(1), (match.group(2) or "").lower()
    return int(float(number) * _UNITS[unit])


class DeviceSpec(StrictModel):
    type: DeviceType = "cpu"
    variant: str = "auto"
    count: int = Field(default=0, ge=0, validate_default=True)

    @field_validator("type", mode="before")
    @classmethod
    def _lower_type(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip().lower()
        if not value:
            raise ValueError("must be a device variant such as h100 or v5p-8, or auto")
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
    replicas: int = Field(default=1, ge=1)
    cpu: float = Field(default=0.0, ge=0, description="cores per replica; 0 leaves it to the backend")
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


class ConstraintSpec(StrictModel):
    """``{"key": ..., "op": ..., "values": [...]}`` as submitted; ``value`` is accepted for one value."""

    key: str
    op: Op
    values: tuple[str | int | float | bool, ...] = Field(default=(), validate_default=True)
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
        try:
            return check_key(value)
        except ConstraintError as error:
            raise PydanticCustomError("constraint_key", str(error)) from None

    @field_validator("op", mode="before")
    @classmethod
    def _op(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return check_op(info.data.get("key", ""), value)
        except ConstraintError as error:
            raise PydanticCustomError("constraint_op", str(error)) from None

    @field_validator("values")
    @classmethod
    def _values(cls, value: tuple[str | int | float | bool, ...], info: ValidationInfo) -> tuple[Scalar, ...]:
        if "key" not in info.data or "op" not in info.data:
            return tuple(normalize_value(v) for v in value)
        try:
            return check_values(info.data["key"], info.data["op"], value)
        except ConstraintError as error:
            raise PydanticCustomError("constraint_values", str(error)) from None

    def to_constraint(self) -> Constraint:
        return Constraint(self.key, self.op, self.values)  # already normalized by ``_values``


def _band(value: Any) -> Band:
    if isinstance(value, Band):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("band_type", "must be a band name such as interactive")
    try:
        band = parse_band(value)
    except UnknownBandError as error:
        raise PydanticCustomError("band", str(error)) from None
    assert band is not None
    return band


class JobSpec(StrictModel):
    """A job as submitted. Derived views (routing constraints, pin, gate) are properties."""

    job_id: str
    command: tuple[str, ...] = ()
    image: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(
        default_factory=dict,
        description='workdir files travelling with the job: relative path -> text, or "base64:<data>" for bytes',
    )
    resources: Resources = Resources()
    constraints: tuple[ConstraintSpec, ...] = ()
    regions: tuple[str, ...] | None = Field(
        default=None, description=f'shorthand for a region constraint; ["{ANY_REGION}"] means any region'
    )
    priority_band: Band = DEFAULT_BAND
    target_cluster: str = Field(default="", validate_default=True)
    parent_job_id: str | None = None
    scheduling_deadline_ms: int | None = Field(default=None, ge=0)
    # The parent's lifecycle settings (core/peer_loss.py, core/start_timeout.py): never sent to a peer.
    parent_only: ClassVar[frozenset[str]] = frozenset({"on_peer_lost", "start_timeout_seconds"})
    on_peer_lost: Literal["fail", "requeue"] = Field(default="fail", description="a running job's lost peer")
    start_timeout_seconds: int | None = Field(default=None, ge=0, description="default: the cluster's; 0: off")

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str) -> str:
        if len(value) > 512 or not JOB_ID_PATTERN.fullmatch(value):
            raise PydanticCustomError(
                "job_id",
                "must look like /<user>/<name> (no spaces or empty segments), got {value}",
                {"value": repr(value)},
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        # A single string is a shell command line.
        return ("/bin/sh", "-c", value) if isinstance(value, str) else value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(name for name in value if not _ENV_NAME.fullmatch(name))
        if bad:
            raise PydanticCustomError(
                "env_name",
                "invalid variable name(s) {bad}; names are letters, digits and _",
                {"bad": ", ".join(bad)},
            )
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        total = 0
        for path, content in value.items():
            parts = PurePosixPath(path).parts
            if not path or path.startswith("/") or ".." in parts or "\\" in path:
                raise PydanticCustomError(
                    "file_path", "{path}: must be a relative path inside the job's workdir", {"path": repr(path)}
                )
            total += len(file_bytes(content))
        if len(value) > MAX_FILES or total > MAX_FILES_BYTES:
            raise PydanticCustomError(
                "files_size",
                "at most {count} files and {size} bytes in all travel inline with a job; "
                "put larger inputs in an object store the peer can read",
                {"count": MAX_FILES, "size": MAX_FILES_BYTES},
            )
        return value

    @field_validator("priority_band", mode="before")
    @classmethod
    def _priority_band(cls, value: Any) -> Band:
        return _band(value)

    @field_validator("target_cluster", mode="before")
    @classmethod
    def _target_cluster(cls, value: Any) -> Any:
        return "" if value is None else value.strip() if isinstance(value, str) else value

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        if value is None:
            return None
        if any(c.key == "region" for c in info.data.get("constraints", ())):
            raise ValueError("give regions or a region constraint, not both")
        cleaned = tuple(v.strip().lower() for v in value)
        if not cleaned or any(not v for v in cleaned):
            raise ValueError(f'must list region names, or ["{ANY_REGION}"] for any region')
        if ANY_REGION in cleaned and len(cleaned) > 1:
            raise ValueError(f'"{ANY_REGION}" (any region) cannot be combined with named regions')
        return cleaned

    @field_validator("target_cluster")
    @classmethod
    def _single_pin(cls, value: str, info: ValidationInfo) -> str:
        pins = {str(c.values[0]) for c in info.data.get("constraints", ()) if c.key == CLUSTER_KEY}
        if value:
            pins.add(value)
        if len(pins) > 1:
            raise ValueError(f"conflicting pins {', '.join(sorted(pins))} (target_cluster and cluster constraints)")
        return value

    @field_validator("parent_job_id")
    @classmethod
    def _parent(cls, value: str | None, info: ValidationInfo) -> str | None:
        job_id = info.data.get("job_id")
        if value is not None and job_id is not None:
            parent = _parent_of(job_id)
            if value != parent:
                raise ValueError(f"must be the parent path of job_id ({parent or 'none: it is a root job'})")
        return value

    @field_serializer("priority_band")
    def _dump_band(self, value: Band) -> str:
        return value.wire_name

    # Derived views -------------------------------------------------------------------------

    @property
    def inferred_parent(self) -> str | None:
        return _parent_of(self.job_id)

    @property
    def is_root(self) -> bool:
        return self.inferred_parent is None

    @property
    def root_job_id(self) -> str:
        return "/".join(self.job_id.split("/")[:3])

    @property
    def pin(self) -> str:
        """The peer this job is pinned to (``target_cluster`` or a ``cluster EQ`` constraint), or ``""``."""
        return self.target_cluster or directive(self.explicit_constraints, CLUSTER_KEY)

    @property
    def backend_pin(self) -> str:
        return directive(self.explicit_constraints, BACKEND_KEY)

    @property
    def explicit_constraints(self) -> tuple[Constraint, ...]:
        return tuple(spec.to_constraint() for spec in self.constraints)

    @property
    def effective_constraints(self) -> tuple[Constraint, ...]:
        """Explicit constraints merged over those the device implies, plus ``regions``."""
        explicit = list(self.explicit_constraints)
        if self.regions and self.regions != (ANY_REGION,):
            op = "EQ" if len(self.regions) == 1 else "IN"
            explicit.append(make_constraint("region", op, list(self.regions)))
        device = self.resources.device
        return merge_constraints(device_constraints(device.type, device.variant), explicit)

    @property
    def routing(self) -> tuple[Constraint, ...]:
        return routing_constraints(self.effective_constraints)

    @property
    def gate(self) -> dict[str, int]:
        return self.resources.gate()

    def with_default_region(self, region: str) -> JobSpec:
        """Apply a cluster's default region unless the job names one or asks for any region."""
        if not region or self.regions is not None or any(c.key == "region" for c in self.constraints):
            return self
        return self.model_copy(update={"regions": (region.strip().lower(),)})


def file_bytes(content: str) -> bytes:
    """A workdir file's bytes: text as UTF-8, or decoded from ``base64:<data>``."""
    if content.startswith(BASE64_PREFIX):
        try:
            return base64.b64decode(content[len(BASE64_PREFIX) :], validate=True)
        except binascii.Error:
            raise PydanticCustomError("file_base64", "content after base64: is not valid base64") from None
    return content.encode()


def _parent_of(job_id: str) -> str | None:
    parent = job_id.rpartition("/")[0]
    return parent if parent.count("/") >= 2 else None


def parse_job(data: Any, *, path: str = "") -> JobSpec:
    """Validate a job document; raise :class:`SpecError` naming every bad field."""
    if isinstance(data, JobSpec):
        return data
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError.from_validation_error(error, path) from None

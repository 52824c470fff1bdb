"""The job spec: what a user submits, validated once, before anything is written.

A job is a command and an image with resources (a device type and variant, a count per replica,
replicas, cpu, memory), constraints, a priority band, an optional pin to a peer
(``target_cluster``) and an optional scheduling deadline. Job ids are cluster-invariant:
``/<user>/<name>`` for a root job, with more path segments for its children.

Every field is checked here, and only here, against its rule: the job id
(``core/job_ids.py``), the command, image and environment (``core/job_launch.py``), the files
(``core/job_files.py``) or their bundle (``core/bundles.py``), resources (``core/resources.py``), constraints
(``core/constraint_spec.py``); every number against its range and every input against its size
(``core/limits.py``), names and text against ``core/characters.py``. Whatever passes can be
written, started, stored as JSON and turned into a run id, a directory or a Kubernetes object.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_serializer, field_validator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.bands import DEFAULT_BAND, Band, UnknownBandError, parse_band
from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.characters import describe_refused, refused_in_name
from iris_airflow_provider.core.constraint_spec import ConstraintSpec
from iris_airflow_provider.core.constraints import (
    ANY_REGION,
    BACKEND_KEY,
    CLUSTER_KEY,
    Constraint,
    device_constraints,
    directive,
    make_constraint,
    merge_constraints,
    routing_constraints,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.job_files import check_files
from iris_airflow_provider.core.job_ids import JobId
from iris_airflow_provider.core.job_launch import check_command, check_env, check_image
from iris_airflow_provider.core.limits import (
    DEADLINE,
    MAX_COMMAND_ARGUMENTS,
    MAX_CONSTRAINTS,
    MAX_ENV_VARIABLES,
    MAX_NAME_LENGTH,
    MAX_PREFERRED_VARIANTS,
    MAX_REGIONS,
    START_TIMEOUT,
)
from iris_airflow_provider.core.resources import Resources
from iris_airflow_provider.core.serving import MAX_PORTS, PortSpec, check_ports
from iris_airflow_provider.core.strict_model import StrictModel

Deadline = Annotated[int, BeforeValidator(DEADLINE.check), Field(ge=DEADLINE.low)]
StartTimeout = Annotated[int, BeforeValidator(START_TIMEOUT.check), Field(ge=START_TIMEOUT.low)]


def _band(value: Any) -> Band:
    if isinstance(value, Band):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("band_type", "must be a band name such as interactive")
    try:
        band = parse_band(value[:64])  # longer is no band; the error quotes no more
    except UnknownBandError as error:
        raise PydanticCustomError("band", str(error)) from None
    assert band is not None
    return band


def _short_name(value: str, what: str) -> str:
    """``value`` when it can be a name (a region, a pin); else ``ValueError`` naming ``what`` it must be."""
    refused = refused_in_name(value)
    if refused:
        raise ValueError(f"must be {what}; holds {describe_refused(refused)}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"must be {what} of at most {MAX_NAME_LENGTH} characters")
    return value


class JobSpec(StrictModel):
    """A job as submitted. Derived views (routing constraints, pin, gate) are properties."""

    job_id: JobId
    command: tuple[str, ...] = Field(default=(), max_length=MAX_COMMAND_ARGUMENTS)
    image: str = ""
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARIABLES)
    files: dict[str, str] = Field(
        default_factory=dict,
        description='workdir files travelling with the job: relative path -> text, or "base64:<data>" for bytes',
    )
    # A workdir too big for ``files`` travels as a content-addressed bundle (core/bundles.py).
    bundle: BundleRef | None = Field(
        default=None, description="the workdir as an uploaded bundle: {digest: sha256:<hex>, size: bytes}"
    )
    resources: Resources = Resources()
    constraints: tuple[ConstraintSpec, ...] = Field(default=(), max_length=MAX_CONSTRAINTS)
    regions: tuple[str, ...] | None = Field(
        default=None,
        max_length=MAX_REGIONS,
        description=f'shorthand for a region constraint; ["{ANY_REGION}"] means any region',
    )
    priority_band: Band = DEFAULT_BAND
    # Device variants the job prefers free room for without taking any (a coordinator whose children
    # will need them): a placement tie-break, never a gate, never reserved (core/placement.py).
    prefer: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_PREFERRED_VARIANTS,
        description="device variants to land near, lowercased (e.g. h100); placement only",
    )
    # Named ports the job serves on: the backend picks each number (IRIS_PORT_<NAME>) and the cluster
    # serves it at a capability URL (core/serving.py).
    ports: tuple[PortSpec, ...] = Field(
        default=(), max_length=MAX_PORTS, description='named ports the job serves on, e.g. [{"name": "http"}]'
    )
    target_cluster: str = Field(default="", validate_default=True)
    parent_job_id: str | None = None  # must equal the job id's parent path, so the id's rule holds for it
    scheduling_deadline_ms: Deadline | None = Field(default=None, description="epoch milliseconds")
    # The parent's own settings (core/peer_loss.py, core/start_timeout.py, placement's ``prefer``):
    # never sent to a peer.
    parent_only: ClassVar[frozenset[str]] = frozenset({"on_peer_lost", "start_timeout_seconds", "prefer"})
    on_peer_lost: Literal["fail", "requeue"] = Field(default="fail", description="a running job's lost peer")
    start_timeout_seconds: StartTimeout | None = Field(default=None, description="default: the cluster's; 0: off")

    @field_validator("command", mode="before")
    @classmethod
    def _command_line(cls, value: Any) -> Any:
        # A single string is a shell command line.
        return ("/bin/sh", "-c", value) if isinstance(value, str) else value

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_command(value))

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return check_image(value)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return dict(check_env(value, info.data.get("command")))

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        return dict(check_files(value))

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, value: BundleRef | None, info: ValidationInfo) -> BundleRef | None:
        if value is not None and info.data.get("files"):
            raise ValueError(
                "give files or a bundle, not both (the operator's workdir= packs a job's own files into its bundle)"
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
        cleaned = tuple(_short_name(v, "a region name").strip().lower() for v in value)
        if not cleaned or any(not v for v in cleaned):
            raise ValueError(f'must list region names, or ["{ANY_REGION}"] for any region')
        if ANY_REGION in cleaned and len(cleaned) > 1:
            raise ValueError(f'"{ANY_REGION}" (any region) cannot be combined with named regions')
        return cleaned

    @field_validator("prefer")
    @classmethod
    def _prefer(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        cleaned = tuple(_short_name(v, "a device variant such as h100").strip().lower() for v in value)
        if any(not v for v in cleaned):
            raise ValueError("must list device variants such as h100; an empty name prefers nothing")
        return tuple(dict.fromkeys(cleaned))  # once each, in the order given

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: tuple[PortSpec, ...]) -> tuple[PortSpec, ...]:
        return check_ports(value)

    @field_validator("target_cluster")
    @classmethod
    def _single_pin(cls, value: str, info: ValidationInfo) -> str:
        _short_name(value, "a peer's name")
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

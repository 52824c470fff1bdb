"""A process backend's entry in the cluster file: device slots, attributes, limits, state directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from iris_airflow_provider.core.names import check_name
from iris_airflow_provider.core.strict_model import StrictModel


class ProcessBackendConfig(StrictModel):
    id: str
    kind: Literal["process"]
    devices: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="device slots per variant, e.g. {h100: 8}"
    )
    device_type: Literal["gpu", "tpu", "cpu"] | None = Field(default=None, description="default: gpu with devices")
    attributes: dict[str, list[str]] = Field(default_factory=dict, description="extra advertised attributes")
    max_running_jobs: int | None = Field(default=None, ge=1)
    state_dir: Path | None = Field(default=None, description="default: <state_dir>/<cluster>/<backend id>")
    env: dict[str, str] = Field(default_factory=dict, description="defaults for every job; a job's env wins")

    _check_id = field_validator("id")(check_name)

    @field_validator("devices")
    @classmethod
    def _lower(cls, value: dict[str, int]) -> dict[str, int]:
        return {variant.strip().lower(): slots for variant, slots in value.items()}

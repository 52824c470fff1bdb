"""Wire shapes shared by heartbeats, the peer API, the store and ``simulate``.

A backend summary is the seed's capability heartbeat for one backend: its id, kind, advertised
attributes (multi-valued) and availability block (``version``, ``observation_epoch_ms``,
``amounts`` free, ``total_amounts``, ``held_by_band``). A block of a version newer than we
understand is kept as "shape only"; band names may carry the ``PRIORITY_BAND_`` prefix; amounts may
be strings (proto3 JSON prints int64 as strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.availability import AVAILABILITY_METRIC_VERSION, Availability, PeerBackend
from iris_airflow_provider.core.bands import Band, UnknownBandError, parse_band
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.strict_model import StrictModel

Amounts = dict[str, Annotated[int, Field(ge=0, strict=False)]]
AttributeValues = list[str | int | float | bool]


def _amounts(value: Any) -> Any:
    """Amount tokens are variant names: lowercased, as everywhere else."""
    if not isinstance(value, Mapping):
        return value
    return {str(token).strip().lower(): amount for token, amount in value.items()}


def amounts_validator(*fields: str) -> Any:
    """A ``before`` validator lowercasing the tokens of amount maps."""
    return field_validator(*fields, mode="before")(_amounts)


class HeldByBand(StrictModel):
    band: Band | None  # None: UNSPECIFIED, ignored
    amounts: Amounts

    @field_validator("band", mode="before")
    @classmethod
    def _band(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise PydanticCustomError("band_type", "must be a band name such as PRIORITY_BAND_BATCH")
        try:
            return parse_band(value, unspecified=None)
        except UnknownBandError as error:
            raise PydanticCustomError("band", str(error)) from None

    _check_amounts = amounts_validator("amounts")


class AvailabilityBlock(StrictModel):
    version: int = Field(ge=1)
    observation_epoch_ms: int = Field(ge=0)
    amounts: Amounts = Field(default_factory=dict)
    total_amounts: Amounts = Field(default_factory=dict)
    held_by_band: list[HeldByBand] = Field(default_factory=list)

    _check_amounts = amounts_validator("amounts", "total_amounts")

    def to_core(self) -> Availability:
        held: dict[Band, dict[str, int]] = {}
        for entry in self.held_by_band:
            if entry.band is not None:
                bucket = held.setdefault(entry.band, {})
                for token, amount in entry.amounts.items():
                    bucket[token] = bucket.get(token, 0) + amount
        return Availability(self.version, self.observation_epoch_ms, self.amounts, self.total_amounts, held)


class BackendSummary(StrictModel):
    backend_id: str = Field(min_length=1)
    kind: str = ""
    advertised_attributes: dict[str, AttributeValues] = Field(default_factory=dict)
    availability: AvailabilityBlock | None = None
    # Set when the block's version is newer than we understand: the backend is matched on shape alone.
    unsupported_availability_version: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _future_versions(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(block := data.get("availability"), Mapping):
            version = block.get("version")
            if isinstance(version, str) and version.strip().isdigit():
                version = int(version)  # proto3 JSON (list-peers output) prints the version as a string
            if isinstance(version, int) and not isinstance(version, bool) and version > AVAILABILITY_METRIC_VERSION:
                return {**data, "availability": None, "unsupported_availability_version": version}
        return data

    def to_core(self) -> PeerBackend:
        availability = self.availability.to_core() if self.availability else None
        if self.unsupported_availability_version is not None:
            availability = Availability(self.unsupported_availability_version, 0, {})
        return PeerBackend(self.backend_id, normalize_advertised(self.advertised_attributes), availability, self.kind)

    @classmethod
    def of(cls, backend: PeerBackend) -> dict[str, Any]:
        """The wire form of a backend, as a heartbeat sends it."""
        availability = backend.availability
        return {
            "backend_id": backend.backend_id,
            "kind": backend.kind,
            "advertised_attributes": {key: list(values) for key, values in backend.advertised.items()},
            "availability": availability.to_wire() if availability is not None else None,
        }

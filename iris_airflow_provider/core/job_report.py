"""The one value that says where an incarnation of a job stands: its state, exit code, error, times
replicas and result. Backends and peers report it; the store's row, the trigger's snapshot and the peer
wire convert to and from it (:func:`projected`), so no layer copies job-state fields by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from iris_airflow_provider.core.states import JobState

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    index: int
    state: JobState
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class ChildReport:
    """A child of a handed-off root, as the peer running its tree reports it (under its job id)."""

    job_id: str
    state: JobState
    exit_code: int | None = None
    error: str = ""
    started_at_ms: int | None = None
    finished_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobReport:
    job_id: str
    nonce: str
    state: JobState
    backend_id: str
    error: str = ""
    exit_code: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    replicas: tuple[ReplicaReport, ...] = ()
    # What a succeeded incarnation handed back at $IRIS_RESULT, as JSON text (core/job_result.py).
    result: str | None = None
    # A root's tree as the peer running it reports it (None: a runner that reports no children).
    children: tuple[ChildReport, ...] | None = None
    # The serving URL of each named port, as the peer running a handed-off job minted them (None: not
    # reported). The parent keeps only those core/serving.py's ``accepted_serving_urls`` accepts.
    serving_urls: Mapping[str, str] | None = None


def projected(source: object, target: type[T], **overrides: Any) -> T:
    """A ``target`` dataclass built from the attributes of ``source`` named like its fields (or a
    mapping's keys), with ``overrides`` winning; fields ``source`` lacks keep their defaults. One
    way to convert between the shapes of a job's state, instead of a hand-written copy per pair."""
    names = [field.name for field in dataclasses.fields(target)]  # type: ignore[arg-type]
    if isinstance(source, Mapping):
        values = {name: source[name] for name in names if name in source}
    else:
        values = {name: getattr(source, name) for name in names if hasattr(source, name)}
    return target(**(values | overrides))

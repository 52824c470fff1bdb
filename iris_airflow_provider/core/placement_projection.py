"""What placement reads of a job spec, as a short text kept beside the spec in the store.

The tick reads every queued job on every tick. Validating 100,000 full specs (command, env, files,
every constraint) to use four of their properties made a tick 20 times slower than the placement
pass itself. Admission writes :func:`projection` of the spec once; the tick reads it back with
:func:`candidate`. Band, submit time and deadline have columns of their own; the avoided peers come
from the row. Jobs mostly share a few shapes, so the decoding is memoized on the text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache

from iris_airflow_provider.core.bands import Band, parse_band
from iris_airflow_provider.core.constraints import Constraint, Op
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.placement import Candidate

PROJECTION_VERSION = 1

# pin, routing, gate, preferred variants
Projected = tuple[str, tuple[Constraint, ...], tuple[tuple[str, int], ...], tuple[str, ...]]


def projection(spec: JobSpec) -> str:
    """The pin, routing constraints, gate and preference of ``spec``, as the store keeps them
    (compact JSON; ``prefer`` only when there is one, so projections written before it read the same)."""
    fields: dict[str, object] = {
        "v": PROJECTION_VERSION,
        "pin": spec.pin,
        "routing": [[c.key, c.op.value, list(c.values)] for c in spec.routing],
        "gate": sorted(spec.gate.items()),
    }
    if spec.prefer:
        fields["prefer"] = list(spec.prefer)
    return json.dumps(fields, separators=(",", ":"))


@lru_cache(maxsize=65_536)
def parse_projection(text: str) -> Projected:
    """What a :func:`projection` holds (memoized: shapes repeat)."""
    raw = json.loads(text)
    if raw.get("v") != PROJECTION_VERSION:
        raise ValueError(f"placement projection version {raw.get('v')!r}; accepted: {PROJECTION_VERSION}")
    routing = tuple(Constraint(key, Op(op), tuple(values)) for key, op, values in raw["routing"])
    gate = tuple((token, int(amount)) for token, amount in raw["gate"])
    return raw["pin"], routing, gate, tuple(raw.get("prefer", ()))


@lru_cache(maxsize=16)
def band_of(stored: str) -> Band:
    """The band a ``priority_band`` column holds (its wire name)."""
    band = parse_band(stored, unspecified=None)
    if band is None:
        raise ValueError(f"priority_band {stored!r} names no band")
    return band


def candidate(
    job_id: str,
    priority_band: str,
    submitted_at_ms: int,
    deadline_ms: int | None,
    text: str,
    avoided_peer_ids: Iterable[str] = (),
) -> Candidate:
    """The queued job as placement sees it, from its stored columns and projection: the same
    :class:`Candidate` as ``Candidate.from_job`` of its parsed spec."""
    pin, routing, gate, prefer = parse_projection(text)
    return Candidate(
        job_id=job_id,
        band=band_of(priority_band),
        submitted_at_ms=submitted_at_ms,
        pinned_peer_id=pin,
        shape=routing,
        gate=gate,
        deadline_ms=deadline_ms,
        avoided_peer_ids=frozenset(avoided_peer_ids),
        prefer=prefer,
    )

"""Small builders for core objects, so tests read like the scenarios they check."""

from __future__ import annotations

from typing import Any

from iris_airflow_provider.core.availability import Availability, PeerBackend, PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Candidate

NOW = 1_000_000


def backend(
    backend_id: str,
    *,
    free: dict[str, int] | None = None,
    held: dict[Band, dict[str, int]] | None = None,
    total: dict[str, int] | None = None,
    epoch: int = NOW - 10_000,
    version: int = 2,
    **attributes: Any,
) -> PeerBackend:
    """A peer backend; ``free=None`` means it reports no availability block (shape only)."""
    advertised = normalize_advertised(
        {key.replace("_", "-"): value if isinstance(value, list) else [value] for key, value in attributes.items()}
    )
    availability = None
    if free is not None:
        availability = Availability(version, epoch, free, total or {}, held or {})
    return PeerBackend(backend_id, advertised, availability)


def gpu(backend_id: str, variant: str, free: int | None, **kwargs: Any) -> PeerBackend:
    held = kwargs.pop("held", None)
    return backend(
        backend_id,
        free=None if free is None else {variant: free},
        held={band: {variant: n} for band, n in (held or {}).items()} or None,
        device_type="gpu",
        device_variant=variant,
        **kwargs,
    )


def peer(
    peer_id: str,
    *backends: PeerBackend,
    reachable: bool = True,
    last_contact_ms: int = NOW - 5_000,
    observed_after_ms: int | None = None,
) -> PeerState:
    return PeerState(peer_id, reachable, last_contact_ms, tuple(backends), observed_after_ms)


def job(
    job_id: str,
    *,
    variant: str = "h100",
    count: int = 8,
    replicas: int = 1,
    device: str = "gpu",
    band: str = "interactive",
    submitted: int = 0,
    pin: str = "",
    deadline: int | None = None,
    constraints: list[dict[str, Any]] | None = None,
    prefer: list[str] | None = None,
) -> Candidate:
    spec = parse_job(
        {
            "job_id": job_id,
            "resources": {
                "device": {"type": device, "variant": variant, "count": count} if device != "cpu" else {"type": "cpu"},
                "replicas": replicas,
            },
            "priority_band": band,
            "target_cluster": pin,
            "scheduling_deadline_ms": deadline,
            "constraints": constraints or [],
            "prefer": prefer or [],
        }
    )
    return Candidate.from_job(spec, submitted)


def cpu_job(job_id: str, **kwargs: Any) -> Candidate:
    return job(job_id, device="cpu", **kwargs)

"""Whether a job can run on a process backend, checked before anything is written: the device slots
it takes here, and what unpacks its workdir bundle. A refusal is ``InsufficientCapacityError`` where a
larger cluster may take the job (the parent then requeues it), ``SubmissionRefusedError`` where the
job's shape is wrong for this backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from iris_airflow_provider.backends.base import InsufficientCapacityError, SubmissionRefusedError
from iris_airflow_provider.backends.bundles import BundleSource
from iris_airflow_provider.backends.process.state import BackendSettings
from iris_airflow_provider.core.model import JobSpec


def device_need(spec: JobSpec, settings: BackendSettings) -> dict[str, int]:
    """The device slots a job takes here, by variant, or a refusal naming what is missing."""
    device = spec.resources.device
    backend_id, device_type, devices = settings.backend_id, settings.device_type, settings.devices
    if device.type == "cpu":
        return {}
    if device.type != device_type:
        raise SubmissionRefusedError(f"backend {backend_id} has {device_type} devices, not {device.type}")
    variants = [device.variant] if device.variant != "auto" else sorted(devices)
    for variant in variants:
        if devices.get(variant, 0) >= device.count * spec.resources.replicas:
            return {variant: device.count * spec.resources.replicas}
    # Too few of a variant it has: another cluster may be larger. None of it at all: a wrong shape.
    refusal = InsufficientCapacityError if any(v in devices for v in variants) else SubmissionRefusedError
    raise refusal(
        f"backend {backend_id} cannot ever host {spec.resources.replicas} x {device.count} "
        f"{device.variant}: it has {devices or 'no devices'}"
    )


def bundle_unpacker(spec: JobSpec, bundles: BundleSource | None, backend_id: str) -> Callable[[Path], None] | None:
    """What writes the job's bundle into its new workdir (None: it has none). InsufficientCapacityError
    when this backend takes no bundle that large (another cluster may), SubmissionRefusedError when the
    bundle is not in its store."""
    bundle = spec.bundle
    if bundle is None:
        return None
    if bundles is None or bundle.size > bundles.max_bundle_bytes:
        raise InsufficientCapacityError(
            f"job {spec.job_id} carries a workdir bundle of {bundle.size} bytes; backend {backend_id} "
            f"takes bundles of at most {bundles.max_bundle_bytes if bundles is not None else 0} bytes"
        )
    if not bundles.has(bundle):
        raise SubmissionRefusedError(f"job {spec.job_id}: its workdir bundle {bundle.digest} is not here")
    return lambda workdir: bundles.unpack(bundle, workdir)

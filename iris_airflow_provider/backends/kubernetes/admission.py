"""Whether a job can run on a Kubernetes backend, and where its pods may go, decided before any Job
is made: a refusal names what the backend lacks (an image, room for the job's files, its GPU or TPU
variant), as ``SubmissionRefusedError``, or as ``InsufficientCapacityError`` where another cluster may
have it (the parent then requeues the job); else the ``JobPlacement`` ``manifests.py`` builds from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from iris_airflow_provider.backends.base import InsufficientCapacityError, SubmissionRefusedError
from iris_airflow_provider.backends.kubernetes.capacity import CapacityPolicy, cluster_capacity
from iris_airflow_provider.backends.kubernetes.manifests import JobPlacement
from iris_airflow_provider.core.job_files import file_bytes
from iris_airflow_provider.core.model import JobSpec


@dataclass(frozen=True, slots=True)
class Admission:
    """What a backend can take: its id (for messages), default image, how and how many bytes of
    workdir files it passes (``files_in``, ``max_files_bytes``), the largest bundle it runs (0: none)
    and how it reads GPUs off its nodes (``policy``)."""

    backend_id: str
    default_image: str
    files_in: str
    max_files_bytes: int
    max_bundle_bytes: int
    policy: CapacityPolicy

    def placement(self, spec: JobSpec, nodes: Callable[[], Sequence[Any]]) -> JobPlacement:
        """Where the job's pods may run, or a refusal naming what this backend lacks; ``nodes`` is
        read only for a job of a concrete GPU or TPU variant."""
        if not (spec.image or self.default_image):
            raise SubmissionRefusedError(
                f"job {spec.job_id} names no image and backend {self.backend_id} has no default image"
            )
        if spec.bundle is not None and spec.bundle.size > self.max_bundle_bytes:
            # Not here, maybe on another cluster: the parent requeues it.
            where = (
                f"takes bundles of at most {self.max_bundle_bytes} bytes (bundles.max_bundle_bytes)"
                if self.max_bundle_bytes
                else "has no bundle_store (gs://bucket/prefix) for its pods to fetch bundles from"
            )
            raise InsufficientCapacityError(
                f"job {spec.job_id} carries a workdir bundle of {spec.bundle.size} bytes; backend {self.backend_id} "
                f"{where}, and passes workdir files only in a {self.files_in} of at most {self.max_files_bytes} "
                "bytes (max_files_bytes)"
            )
        total = sum(len(file_bytes(content)) for content in spec.files.values())
        if total > self.max_files_bytes:
            raise SubmissionRefusedError(
                f"job {spec.job_id} carries {total} bytes of workdir files; backend {self.backend_id} passes at most "
                f"{self.max_files_bytes} bytes in a {self.files_in} (max_files_bytes; Kubernetes allows 1 MiB): "
                "put larger inputs in an object store the cluster can read"
            )
        device = spec.resources.device
        if device.type == "tpu":
            return self._tpu_placement(spec, nodes)
        if device.type == "cpu" or device.variant == "auto":
            return JobPlacement()
        found = nodes()
        capacity = cluster_capacity(found, [], self.policy)
        offered = capacity.variants.get(device.variant)
        if offered is None or device.variant in capacity.tpu_variants:
            raise SubmissionRefusedError(
                f"backend {self.backend_id} has no {device.variant} GPUs; "
                f"it has {', '.join(sorted(capacity.variants)) or 'none'}"
            )
        if offered.largest_node and device.count > offered.largest_node:
            raise InsufficientCapacityError(
                f"backend {self.backend_id}: a replica needs {device.count} {device.variant} GPUs, "
                f"but no node has more than {offered.largest_node}"
            )
        if self.policy.variant:
            return JobPlacement(device.variant)
        values = tuple(self.policy.label_values_of(device.variant, found))
        return JobPlacement(device.variant, self.policy.variant_label, values)

    def _tpu_placement(self, spec: JobSpec, nodes: Callable[[], Sequence[Any]]) -> JobPlacement:
        """A TPU job runs on the nodes of its slice (``manifests.py`` selects them by GKE's labels)."""
        device = spec.resources.device
        if device.variant == "auto":
            raise SubmissionRefusedError(
                f"job {spec.job_id} asks for TPU variant auto; "
                f"backend {self.backend_id} needs a TPU slice such as v5p-8"
            )
        if spec.resources.replicas > 1 and spec.resources.hosts_per_replica > 1:
            raise SubmissionRefusedError(
                f"job {spec.job_id} asks for {spec.resources.replicas} {device.variant} slices; backend "
                f"{self.backend_id} runs one multi-host slice per job (multislice is not supported)"
            )
        capacity = cluster_capacity(nodes(), [], self.policy)
        if device.variant not in capacity.tpu_variants:
            raise SubmissionRefusedError(
                f"backend {self.backend_id} has no {device.variant} TPU slices; "
                f"it has {', '.join(sorted(capacity.tpu_variants)) or 'none'}"
            )
        return JobPlacement(device.variant)

"""TPU slices by name: what ``v5p-16`` or ``v6e-16`` is made of, and how GKE labels its nodes.

A TPU variant names a slice: a family and a size. For v4 and v5p the size counts TensorCores (two
per chip: ``v5p-16`` is 8 chips); for v5e (``v5litepod-N``, also written ``v5e-N``) and v6e it
counts chips. A slice is taken whole. GKE runs it on ``hosts`` nodes (TPU VMs) of
``chips_per_host`` chips each, labelled ``cloud.google.com/gke-tpu-accelerator`` (the family's
value) and ``cloud.google.com/gke-tpu-topology`` (the slice's), each offering ``google.com/tpu``.

The sizes and topologies are those GKE documents ("Plan TPUs in GKE"; Cloud TPU's v4, v5e, v5p
and v6e pages): v4 and v5p hosts have 4 chips; v5e and v6e slices of up to 8 chips are one host
of that many chips, larger ones hosts of 4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"


@dataclass(frozen=True, slots=True)
class TpuFamily:
    prefix: str  # the variant's name before the dash
    accelerator: str  # the value of ACCELERATOR_LABEL
    cores_per_chip: int  # what the number in the name counts: 2 (TensorCores) or 1 (chips)
    topologies: tuple[str, ...]  # by chip count, ascending

    def chips_per_host(self, chips: int) -> int:
        if self.cores_per_chip == 2:
            return 4
        return chips if chips <= 8 else 4


_CUBES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16")
_PLANES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
FAMILIES: tuple[TpuFamily, ...] = (
    TpuFamily("v4", "tpu-v4-podslice", 2, (*_CUBES, "16x16x16")),
    TpuFamily("v5litepod", "tpu-v5-lite-podslice", 1, _PLANES),
    TpuFamily("v5p", "tpu-v5p-slice", 2, (*_CUBES, "16x16x16", "16x16x24")),
    TpuFamily("v6e", "tpu-v6e-slice", 1, _PLANES),
)
_ALIASES = {"v5e": "v5litepod"}
ACCEPTED_FAMILIES = "v4-N, v5litepod-N (or v5e-N), v5p-N, v6e-N"
_NAME = re.compile(r"([a-z0-9]+)-([0-9]{1,6})")


@dataclass(frozen=True, slots=True)
class TpuSlice:
    """One slice shape: ``hosts`` pods of ``chips_per_host`` chips, on nodes with these labels."""

    variant: str
    accelerator: str
    topology: str
    chips: int
    chips_per_host: int

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def node_labels(self) -> dict[str, str]:
        return {ACCELERATOR_LABEL: self.accelerator, TOPOLOGY_LABEL: self.topology}


class UnknownTpuVariantError(ValueError):
    pass


def _chips(topology: str) -> int:
    product = 1
    for side in topology.split("x"):
        product *= int(side)
    return product


def _slices() -> dict[str, TpuSlice]:
    table: dict[str, TpuSlice] = {}
    for family in FAMILIES:
        for topology in family.topologies:
            chips = _chips(topology)
            variant = f"{family.prefix}-{chips * family.cores_per_chip}"
            table[variant] = TpuSlice(variant, family.accelerator, topology, chips, family.chips_per_host(chips))
    return table


SLICES: dict[str, TpuSlice] = _slices()
_BY_LABELS = {(s.accelerator, s.topology): s for s in SLICES.values()}


def canonical_variant(name: str) -> str:
    """``name`` lowercased, with the ``v5e-N`` spelling as ``v5litepod-N`` (the Cloud TPU name)."""
    name = name.strip().lower()
    match = _NAME.fullmatch(name)
    if match and match.group(1) in _ALIASES:
        return f"{_ALIASES[match.group(1)]}-{match.group(2)}"
    return name


def tpu_slice(variant: str) -> TpuSlice:
    """The slice ``variant`` names; UnknownTpuVariantError (with the accepted names) if none."""
    name = canonical_variant(variant)
    found = SLICES.get(name)
    if found is not None:
        return found
    match = _NAME.fullmatch(name)
    prefix = match.group(1) if match else ""
    family = next((f for f in FAMILIES if f.prefix == prefix), None)
    if family is None:
        raise UnknownTpuVariantError(f"must be a TPU variant of a known family ({ACCEPTED_FAMILIES}) or auto")
    sizes = ", ".join(str(_chips(t) * family.cores_per_chip) for t in family.topologies)
    counted = "TensorCores" if family.cores_per_chip == 2 else "chips"
    raise UnknownTpuVariantError(f"must be a {family.prefix} slice {family.prefix}-N, N ({counted}) one of {sizes}")


def slice_of_node_labels(labels: dict[str, str] | None) -> TpuSlice | None:
    """The slice a GKE TPU node belongs to, by its accelerator and topology labels (None: unknown)."""
    labels = labels or {}
    return _BY_LABELS.get((labels.get(ACCELERATOR_LABEL, ""), labels.get(TOPOLOGY_LABEL, "")))

"""The TPU slice table against GKE's documented shapes ("Plan TPUs in GKE", Cloud TPU's v4, v5e,
v5p and v6e pages): accelerator label, topology, chips, chips per host and hosts per variant."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.tpu import (
    ACCELERATOR_LABEL,
    SLICES,
    TOPOLOGY_LABEL,
    UnknownTpuVariantError,
    canonical_variant,
    slice_of_node_labels,
    tpu_slice,
)

# variant: (accelerator, topology, chips, chips per host, hosts), as documented.
DOCUMENTED = {
    "v4-8": ("tpu-v4-podslice", "2x2x1", 4, 4, 1),
    "v4-16": ("tpu-v4-podslice", "2x2x2", 8, 4, 2),
    "v4-32": ("tpu-v4-podslice", "2x2x4", 16, 4, 4),
    "v4-128": ("tpu-v4-podslice", "4x4x4", 64, 4, 16),
    "v5litepod-1": ("tpu-v5-lite-podslice", "1x1", 1, 1, 1),
    "v5litepod-4": ("tpu-v5-lite-podslice", "2x2", 4, 4, 1),
    "v5litepod-8": ("tpu-v5-lite-podslice", "2x4", 8, 8, 1),
    "v5litepod-16": ("tpu-v5-lite-podslice", "4x4", 16, 4, 4),
    "v5litepod-256": ("tpu-v5-lite-podslice", "16x16", 256, 4, 64),
    "v5p-8": ("tpu-v5p-slice", "2x2x1", 4, 4, 1),
    "v5p-16": ("tpu-v5p-slice", "2x2x2", 8, 4, 2),
    "v5p-32": ("tpu-v5p-slice", "2x2x4", 16, 4, 4),
    "v5p-64": ("tpu-v5p-slice", "2x4x4", 32, 4, 8),
    "v5p-12288": ("tpu-v5p-slice", "16x16x24", 6144, 4, 1536),
    "v6e-1": ("tpu-v6e-slice", "1x1", 1, 1, 1),
    "v6e-4": ("tpu-v6e-slice", "2x2", 4, 4, 1),
    "v6e-8": ("tpu-v6e-slice", "2x4", 8, 8, 1),
    "v6e-16": ("tpu-v6e-slice", "4x4", 16, 4, 4),
    "v6e-32": ("tpu-v6e-slice", "4x8", 32, 4, 8),
    "v6e-256": ("tpu-v6e-slice", "16x16", 256, 4, 64),
}


@pytest.mark.parametrize("variant", sorted(DOCUMENTED))
def test_each_documented_slice(variant: str) -> None:
    found = tpu_slice(variant)
    assert (found.accelerator, found.topology, found.chips, found.chips_per_host, found.hosts) == DOCUMENTED[variant]
    assert found.node_labels == {ACCELERATOR_LABEL: found.accelerator, TOPOLOGY_LABEL: found.topology}
    assert slice_of_node_labels(found.node_labels) == found  # a node's labels name its slice back


def test_the_table_is_consistent() -> None:
    for variant, found in SLICES.items():
        assert found.variant == variant
        assert found.hosts * found.chips_per_host == found.chips
        family, size = variant.rsplit("-", 1)
        assert int(size) == found.chips * (2 if family in ("v4", "v5p") else 1)  # TensorCores or chips


def test_v5e_is_another_name_for_v5litepod() -> None:
    assert canonical_variant(" V5E-16 ") == "v5litepod-16"
    assert tpu_slice("v5e-16") == tpu_slice("v5litepod-16")


def test_unknown_variants_name_what_is_accepted() -> None:
    with pytest.raises(UnknownTpuVariantError, match=r"known family \(v4-N, v5litepod-N \(or v5e-N\), v5p-N, v6e-N\)"):
        tpu_slice("v3-8")
    with pytest.raises(UnknownTpuVariantError, match=r"v6e-N, N \(chips\) one of 1, 4, 8, 16, 32, 64, 128, 256"):
        tpu_slice("v6e-2")
    assert slice_of_node_labels({ACCELERATOR_LABEL: "tpu-v5p-slice", TOPOLOGY_LABEL: "3x3x3"}) is None
    assert slice_of_node_labels(None) is None

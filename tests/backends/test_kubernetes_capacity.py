"""The Kubernetes capacity function, on real ``kubernetes`` client model objects."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import (
    V1Affinity,
    V1Container,
    V1NodeAffinity,
    V1NodeCondition,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodSchedulingGate,
    V1PodSpec,
    V1PodStatus,
    V1ResourceRequirements,
    V1Taint,
    V1Toleration,
)
from kubernetes.client import V1Node as Node

from iris_airflow_provider.backends.kubernetes.capacity import (
    UNATTRIBUTED_BAND,
    VARIANT_POD_LABEL,
    CapacityPolicy,
    cluster_capacity,
    parse_quantity,
    pod_request,
)
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.wire import BackendSummary

PRODUCT = "nvidia.com/gpu.product"
POLICY = CapacityPolicy(
    variant_label=PRODUCT,
    variant_values={"NVIDIA-H100-80GB-HBM3": "h100", "NVIDIA-GB200": "gb200"},
    tolerations=(V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
    band_of_class={"iris-batch": Band.BATCH, "iris-interactive": Band.INTERACTIVE},
)


def node(
    name: str,
    gpus: int,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    *,
    ready: str = "True",
    unschedulable: bool = False,
    taints: list[V1Taint] | None = None,
) -> Node:
    labels = {PRODUCT: product} if product else {}
    return Node(
        metadata=V1ObjectMeta(name=name, labels=labels),
        spec=V1NodeSpec(unschedulable=unschedulable, taints=taints),
        status=V1NodeStatus(
            allocatable={"nvidia.com/gpu": str(gpus), "cpu": "64"},
            conditions=[V1NodeCondition(type="Ready", status=ready)],
        ),
    )


def pod(
    name: str,
    gpus: int,
    *,
    node_name: str | None = "h100-a",
    priority_class: str | None = "iris-batch",
    phase: str = "Running",
    gated: bool = False,
    **spec: Any,
) -> V1Pod:
    container = V1Container(
        name="job",
        image="busybox",
        resources=V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus else None,
    )
    return V1Pod(
        metadata=V1ObjectMeta(name=name, labels=spec.pop("labels", None)),
        spec=V1PodSpec(
            containers=spec.pop("containers", [container]),
            node_name=node_name,
            priority_class_name=priority_class,
            scheduling_gates=[V1PodSchedulingGate(name="kueue.x-k8s.io/admission")] if gated else None,
            **spec,
        ),
        status=V1PodStatus(phase=phase),
    )


def test_gated_finished_admitted_and_unknown_class_pods():
    nodes = [node("h100-a", 8), node("h100-b", 8)]
    pods = [
        pod("batch-running", 4),
        pod("interactive-bound-pending", 2, node_name="h100-b", priority_class="iris-interactive", phase="Pending"),
        # Admitted (no gate) but not bound yet: held all the same, on the variant its selector names.
        pod("batch-unbound", 1, node_name=None, phase="Pending", node_selector={PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
        pod("queued", 8, node_name=None, phase="Pending", gated=True),  # Kueue has not admitted it: holds nothing
        pod("done", 8, phase="Succeeded"),
        pod("crashed", 8, phase="Failed"),
        pod("someone-else", 3, node_name="h100-b", priority_class="team-x"),
        pod("no-class", 1, priority_class=None),
        pod("cpu-only", 0),
    ]
    capacity = cluster_capacity(nodes, pods, POLICY)
    h100 = capacity.variants["h100"]
    assert h100.total == 16
    assert dict(h100.held_by_band) == {Band.BATCH: 5, Band.INTERACTIVE: 2}
    assert h100.unattributed == 4 and h100.held == 11 and h100.free == 5
    assert capacity.unknown_classes == {"team-x": 3, "": 1}
    assert capacity.variants["gb200"].total == 0  # configured but absent: still reported

    availability = capacity.availability(observation_epoch_ms=1_234)
    assert availability.amounts == {"gb200": 0, "h100": 5}
    assert availability.total_amounts == {"gb200": 0, "h100": 16}
    assert availability.held_by_band == {Band.BATCH: {"h100": 5}, Band.INTERACTIVE: {"h100": 2}}
    wire = availability.to_wire()
    # Held by no known band: said in the heartbeat, in the seed's words, and never reclaimable.
    assert {"band": UNATTRIBUTED_BAND, "amounts": {"h100": 4}} in wire["held_by_band"]
    parsed = BackendSummary.model_validate({"backend_id": "k8s", "kind": "kubernetes", "availability": wire}).to_core()
    assert parsed.availability is not None
    assert parsed.availability.held_by_band == {Band.BATCH: {"h100": 5}, Band.INTERACTIVE: {"h100": 2}}
    assert parsed.availability.amounts == {"gb200": 0, "h100": 5}


def test_oversubscription_floors_free_at_zero():
    capacity = cluster_capacity([node("h100-a", 8)], [pod("a", 8), pod("b", 4, node_name=None)], POLICY)
    h100 = capacity.variants["h100"]
    assert (h100.total, h100.held, h100.free) == (8, 12, 0)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (node("cordoned", 8, unschedulable=True), "unschedulable (cordoned)"),
        (node("not-ready", 8, ready="False"), "not Ready"),
        (node("no-status", 8, ready="Unknown"), "not Ready"),
        (
            node("tainted", 8, taints=[V1Taint(key="maintenance", value="true", effect="NoExecute")]),
            "taint maintenance=true:NoExecute not tolerated",
        ),
        (node("unlabelled", 8, product=None), "no variant: label nvidia.com/gpu.product missing or unmapped"),
        (node("unmapped", 8, product="NVIDIA-A10"), "no variant: label nvidia.com/gpu.product missing or unmapped"),
    ],
)
def test_nodes_jobs_cannot_use_are_left_out_with_their_pods(bad: Node, why: str):
    name = bad.metadata.name
    capacity = cluster_capacity([node("h100-a", 8), bad], [pod("on-bad", 8, node_name=name)], POLICY)
    assert capacity.variants["h100"].total == 8
    assert capacity.variants["h100"].held == 0  # its pods held its capacity, which is not counted either
    assert capacity.left_out_nodes == {name: why}


def test_tolerated_and_soft_taints_keep_a_node():
    nodes = [
        node("gpu-taint", 8, taints=[V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]),
        node("soft", 8, taints=[V1Taint(key="spot", effect="PreferNoSchedule")]),
    ]
    capacity = cluster_capacity(nodes, [], POLICY)
    assert capacity.variants["h100"].total == 16 and not capacity.left_out_nodes
    untolerating = CapacityPolicy(variant_label=PRODUCT, variant_values=POLICY.variant_values)
    assert cluster_capacity(nodes, [], untolerating).left_out_nodes == {
        "gpu-taint": "taint nvidia.com/gpu=present:NoSchedule not tolerated"
    }


def test_several_variants_are_each_reported():
    nodes = [node("h100-a", 8), node("gb200-a", 4, product="NVIDIA-GB200"), node("gb200-b", 4, product="NVIDIA-GB200")]
    pods = [
        pod("h", 2, node_name="h100-a"),
        pod("g", 4, node_name="gb200-b", priority_class="iris-interactive"),
        # Unbound, and pinned by node affinity to GB200 nodes.
        pod(
            "g-unbound",
            1,
            node_name=None,
            phase="Pending",
            affinity=V1Affinity(
                node_affinity=V1NodeAffinity(
                    required_during_scheduling_ignored_during_execution=V1NodeSelector(
                        node_selector_terms=[
                            V1NodeSelectorTerm(
                                match_expressions=[
                                    V1NodeSelectorRequirement(key=PRODUCT, operator="In", values=["NVIDIA-GB200"])
                                ]
                            )
                        ]
                    )
                )
            ),
        ),
        pod("ours", 2, node_name=None, phase="Pending", labels={VARIANT_POD_LABEL: "gb200"}),
    ]
    capacity = cluster_capacity(nodes, pods, POLICY)
    assert {v: (c.total, c.held, c.free) for v, c in capacity.variants.items()} == {
        "gb200": (8, 7, 1),
        "h100": (8, 2, 6),
    }
    assert capacity.variants["gb200"].largest_node == 4


def test_an_unbound_pod_that_could_land_anywhere_is_held_against_every_variant():
    nodes = [node("h100-a", 8), node("gb200-a", 4, product="NVIDIA-GB200")]
    capacity = cluster_capacity(nodes, [pod("anywhere", 2, node_name=None, phase="Pending")], POLICY)
    assert {v: c.held for v, c in capacity.variants.items()} == {"gb200": 2, "h100": 2}


def test_a_fixed_variant_counts_every_gpu_node_and_label_values_lowercase_without_a_mapping():
    nodes = [node("a", 8, product=None), node("b", 8, product="whatever")]
    fixed = cluster_capacity(nodes, [pod("p", 3, node_name="a")], CapacityPolicy(variant="h100"))
    assert {v: (c.total, c.free) for v, c in fixed.variants.items()} == {"h100": (16, 13)}
    raw = cluster_capacity([node("a", 8, product="H100-SXM")], [], CapacityPolicy(variant_label=PRODUCT))
    assert list(raw.variants) == ["h100-sxm"]
    cpu_only = cluster_capacity(nodes, [], CapacityPolicy())
    assert cpu_only.variants == {} and set(cpu_only.left_out_nodes) == {"a", "b"}


def test_effective_request_counts_init_containers_sidecars_and_overhead():
    def gpu_container(name: str, gpus: int, restart_policy: str | None = None) -> V1Container:
        return V1Container(
            name=name,
            restart_policy=restart_policy,
            resources=V1ResourceRequirements(
                requests={"nvidia.com/gpu": str(gpus)}, limits={"nvidia.com/gpu": str(gpus)}
            ),
        )

    sidecar_pod = pod(
        "p",
        0,
        containers=[gpu_container("main", 2)],
        init_containers=[gpu_container("sidecar", 1, "Always"), gpu_container("setup", 4)],
        overhead={"nvidia.com/gpu": "1"},
    )
    # Running: 2 + sidecar 1; the init peak is setup 4 + sidecar 1 = 5; plus 1 overhead.
    assert pod_request(sidecar_pod, "nvidia.com/gpu") == 6
    assert pod_request(pod("plain", 3), "nvidia.com/gpu") == 3


@pytest.mark.parametrize(("raw", "value"), [("8", 8), (4, 4), ("500m", 1), ("2k", 2000), ("1Gi", 2**30), (None, 0)])
def test_quantities(raw: Any, value: int):
    assert parse_quantity(raw) == value


def test_a_bad_quantity_is_named():
    with pytest.raises(ValueError, match="not a Kubernetes quantity: 'eight'"):
        parse_quantity("eight")


def tpu_node(name: str, chips: int, accelerator: str = "tpu-v5p-slice", topology: str = "2x2x2") -> Node:
    labels = {"cloud.google.com/gke-tpu-accelerator": accelerator, "cloud.google.com/gke-tpu-topology": topology}
    return Node(
        metadata=V1ObjectMeta(name=name, labels=labels),
        # GKE taints TPU nodes; the TPU pods we make tolerate it, so they count without configuration.
        spec=V1NodeSpec(taints=[V1Taint(key="google.com/tpu", value="present", effect="NoSchedule")]),
        status=V1NodeStatus(
            allocatable={"google.com/tpu": str(chips), "cpu": "200"},
            conditions=[V1NodeCondition(type="Ready", status="True")],
        ),
    )


def tpu_pod(name: str, chips: int, *, node_name: str | None, **spec: Any) -> V1Pod:
    container = V1Container(name="job", resources=V1ResourceRequirements(limits={"google.com/tpu": str(chips)}))
    return V1Pod(
        metadata=V1ObjectMeta(name=name, labels={}),
        spec=V1PodSpec(containers=[container], node_name=node_name, priority_class_name="iris-batch", **spec),
        status=V1PodStatus(phase="Running" if node_name else "Pending"),
    )


def test_tpu_nodes_report_their_chips_per_slice_variant_beside_the_gpus() -> None:
    nodes = [
        node("h100-a", 8),
        tpu_node("v5p-a", 4),
        tpu_node("v5p-b", 4),
        tpu_node("v6e-a", 8, "tpu-v6e-slice", "2x4"),
        tpu_node("odd", 4, "tpu-v5p-slice", "3x3x3"),
    ]
    pods = [
        tpu_pod("on-v5p", 4, node_name="v5p-a"),
        tpu_pod(
            "pending",
            8,
            node_name=None,
            node_selector={
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "2x4",
            },
        ),
    ]
    capacity = cluster_capacity(nodes, pods, POLICY)
    assert {v: (c.total, c.free, c.largest_node) for v, c in capacity.variants.items()} == {
        "gb200": (0, 0, 0),  # configured, none here
        "h100": (8, 8, 8),
        "v5p-16": (8, 4, 4),
        "v6e-8": (8, 0, 8),
    }
    assert capacity.tpu_variants == {"v5p-16", "v6e-8"}
    assert capacity.left_out_nodes == {"odd": "no TPU slice: its GKE accelerator and topology labels name none we know"}
    assert capacity.variants["v5p-16"].held_by_band == {Band.BATCH: 4}

"""What a Kubernetes cluster with Kueue can offer, as a pure function of its nodes and pods.

Per device variant (``nvidia.com/gpu``, the variant read from a node label or fixed by the
backend's configuration):

- ``total``: the allocatable GPUs of the nodes jobs can use. Beyond the reference, nodes that are
  cordoned, not Ready, or carry a NoSchedule/NoExecute taint the jobs do not tolerate are left out
  (their capacity cannot be had), and so are the pods bound to them.
- ``held``: GPUs requested by pods Kueue has admitted: no ``kueue.x-k8s.io/admission`` scheduling
  gate, not Succeeded or Failed, bound to a node or not yet. A gated (queued) pod holds nothing,
  so a long queue never makes the cluster look full.
- ``held_by_band``: each held pod's PriorityClass mapped to a band through the configuration. A
  pod whose class maps to no band is held but not reclaimable: it is reported under the seed's
  ``PRIORITY_BAND_UNSPECIFIED``, which placement never counts as reclaimable.
- ``free = max(0, total - held)``.

TPUs are read the same way, with no configuration: a node offering ``google.com/tpu`` is a host
of the slice its GKE labels name (``cloud.google.com/gke-tpu-accelerator`` and
``cloud.google.com/gke-tpu-topology``, through the core's table, ``core/tpu.py``), and its chips
count for that variant (``v5p-16``); a TPU node whose labels name no known slice is left out.

Every variant is reported, even when the cluster has several (the reference gives up and reports
shape only). A pod not yet bound to a node is attributed to the variant its node selector, node
affinity or our own variant label names; one that could land on several variants is counted
against each of them: looking fuller than it is is safe, looking emptier would over-promote.

The inputs are ``kubernetes`` (or ``kubernetes_asyncio``, same attributes) client model objects.
No I/O, no clock: the observation time comes in as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity as kubernetes_quantity

from iris_airflow_provider.core.availability import AVAILABILITY_METRIC_VERSION, Availability
from iris_airflow_provider.core.bands import BAND_PREFIX, Band
from iris_airflow_provider.core.tpu import TPU_RESOURCE, slice_of_node_labels

GPU_RESOURCE = "nvidia.com/gpu"
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Set on the pods this provider creates, so an unbound pod of ours is attributed exactly.
VARIANT_POD_LABEL = "iris.marin.community/device-variant"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
UNATTRIBUTED_BAND = BAND_PREFIX + "UNSPECIFIED"
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule only discourages


@dataclass(frozen=True, slots=True)
class _Toleration:
    key: str
    operator: str
    effect: str
    value: str = ""


# GKE taints TPU nodes google.com/tpu:NoSchedule; the TPU pods we make tolerate it (manifests.py).
TPU_TOLERATION = _Toleration(TPU_RESOURCE, "Exists", "NoSchedule")


@dataclass(frozen=True, slots=True)
class KubernetesAvailability(Availability):
    """The seed's availability block, plus what is held by pods of no known band.

    On the wire that amount is a ``held_by_band`` entry of band ``PRIORITY_BAND_UNSPECIFIED``: the
    seed's own vocabulary, which every reader accepts and none counts as reclaimable.
    """

    unattributed: Mapping[str, int] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        wire = Availability.to_wire(self)
        unattributed = {token: amount for token, amount in self.unattributed.items() if amount}
        if unattributed:
            entries = wire["held_by_band"]
            assert isinstance(entries, list)
            entries.append({"band": UNATTRIBUTED_BAND, "amounts": unattributed})
        return wire


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """How to read a cluster: which resource, how nodes name their variant, what jobs tolerate."""

    resource: str = GPU_RESOURCE
    variant: str | None = None  # every GPU node is this variant
    variant_label: str | None = None  # else: the node label naming it
    variant_values: Mapping[str, str] = field(default_factory=dict)  # label value -> variant (empty: lowercased)
    tolerations: Sequence[Any] = ()  # V1Toleration-like: key, operator, value, effect
    band_of_class: Mapping[str, Band] = field(default_factory=dict)  # PriorityClass name -> band

    def configured_variants(self) -> set[str]:
        if self.variant:
            return {self.variant}
        return set(self.variant_values.values())

    def variant_of_label_value(self, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if self.variant_values:
            return self.variant_values.get(value)
        return value.strip().lower()

    def node_variant(self, node: Any) -> str | None:
        if self.variant:
            return self.variant
        if not self.variant_label:
            return None
        labels = (node.metadata.labels if node.metadata else None) or {}
        return self.variant_of_label_value(labels.get(self.variant_label))

    def label_values_of(self, variant: str, nodes: Iterable[Any] = ()) -> list[str]:
        """Label values meaning ``variant``: the configured ones, else those the nodes carry."""
        if self.variant_values:
            return sorted(value for value, mapped in self.variant_values.items() if mapped == variant)
        seen = set()
        for node in nodes:
            labels = (node.metadata.labels if node.metadata else None) or {}
            value = labels.get(self.variant_label or "")
            if value and value.strip().lower() == variant:
                seen.add(value)
        return sorted(seen) or [variant]


@dataclass(frozen=True, slots=True)
class VariantCapacity:
    total: int = 0
    held_by_band: Mapping[Band, int] = field(default_factory=dict)
    unattributed: int = 0
    largest_node: int = 0  # the most one node offers: a pod never spans nodes

    @property
    def held(self) -> int:
        return sum(self.held_by_band.values()) + self.unattributed

    @property
    def free(self) -> int:
        return max(0, self.total - self.held)


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    variants: Mapping[str, VariantCapacity]
    left_out_nodes: Mapping[str, str] = field(default_factory=dict)  # node name -> why it does not count
    unknown_classes: Mapping[str, int] = field(default_factory=dict)  # PriorityClass ("" none) -> GPUs held
    tpu_variants: frozenset[str] = frozenset()  # which of ``variants`` are TPU slices (their chips)

    def availability(self, observation_epoch_ms: int) -> KubernetesAvailability:
        held: dict[Band, dict[str, int]] = {}
        for variant, capacity in self.variants.items():
            for band, amount in capacity.held_by_band.items():
                if amount:
                    held.setdefault(band, {})[variant] = amount
        return KubernetesAvailability(
            version=AVAILABILITY_METRIC_VERSION,
            observation_epoch_ms=observation_epoch_ms,
            amounts={variant: capacity.free for variant, capacity in self.variants.items()},
            total_amounts={variant: capacity.total for variant, capacity in self.variants.items()},
            held_by_band=held,
            unattributed={v: c.unattributed for v, c in self.variants.items() if c.unattributed},
        )


def cluster_capacity(nodes: Iterable[Any], pods: Iterable[Any], policy: CapacityPolicy) -> ClusterCapacity:
    """The cluster's GPUs and TPU chips per variant: total on usable nodes, held by admitted pods
    (per band), free."""
    totals: dict[str, int] = dict.fromkeys(policy.configured_variants(), 0)
    largest: dict[str, int] = dict.fromkeys(totals, 0)
    node_devices: dict[str, tuple[str, str]] = {}  # node name -> (resource, variant)
    tpu_variants: set[str] = set()
    left_out: dict[str, str] = {}
    for node in nodes:
        name = node.metadata.name
        allocatable_of = (node.status.allocatable if node.status else None) or {}
        resource = policy.resource
        allocatable = parse_quantity(allocatable_of.get(resource))
        variant: str | None = None
        if allocatable > 0:
            variant = policy.node_variant(node)
            missing = f"no variant: label {policy.variant_label or '(none configured)'} missing or unmapped"
        else:
            resource, allocatable = TPU_RESOURCE, parse_quantity(allocatable_of.get(TPU_RESOURCE))
            if allocatable <= 0:
                continue
            found = slice_of_node_labels(node.metadata.labels)
            variant = found.variant if found else None
            missing = "no TPU slice: its GKE accelerator and topology labels name none we know"
        tolerations = (*policy.tolerations, TPU_TOLERATION) if resource == TPU_RESOURCE else policy.tolerations
        why = _unusable(node, tolerations) or ("" if variant else missing)
        if why:
            left_out[name] = why
            continue
        assert variant is not None
        if resource == TPU_RESOURCE:
            tpu_variants.add(variant)
        node_devices[name] = (resource, variant)
        totals[variant] = totals.get(variant, 0) + allocatable
        largest[variant] = max(largest.get(variant, 0), allocatable)

    by_band: dict[str, dict[Band, int]] = {variant: {} for variant in totals}
    unattributed: dict[str, int] = dict.fromkeys(totals, 0)
    unknown: dict[str, int] = {}
    gpu_variants = sorted(set(totals) - tpu_variants)
    for pod in pods:
        if not holds_capacity(pod):
            continue
        node_name = pod.spec.node_name
        if node_name:
            if node_name not in node_devices:
                continue  # on a node left out (or gone): its capacity is not counted either
            resource, variant = node_devices[node_name]
            amount, variants = pod_request(pod, resource), [variant]
        elif (amount := pod_request(pod, policy.resource)) > 0:
            variants = _candidate_variants(pod, policy, gpu_variants)
        else:
            amount, variants = pod_request(pod, TPU_RESOURCE), _candidate_slices(pod, sorted(tpu_variants))
        if amount <= 0:
            continue
        priority_class = pod.spec.priority_class_name or ""
        band = policy.band_of_class.get(priority_class)
        if band is None:
            unknown[priority_class] = unknown.get(priority_class, 0) + amount
        for variant in variants:
            by_band.setdefault(variant, {})
            unattributed.setdefault(variant, 0)
            totals.setdefault(variant, 0)
            if band is None:
                unattributed[variant] += amount
            else:
                by_band[variant][band] = by_band[variant].get(band, 0) + amount
    return ClusterCapacity(
        {
            variant: VariantCapacity(totals[variant], by_band[variant], unattributed[variant], largest.get(variant, 0))
            for variant in sorted(totals)
        },
        left_out,
        unknown,
        frozenset(tpu_variants),
    )


def holds_capacity(pod: Any) -> bool:
    """Admitted by Kueue (no admission gate) and not finished: its requests are held."""
    phase = pod.status.phase if pod.status else None
    if phase in FINISHED_PHASES:
        return False
    return not any(gate.name == KUEUE_ADMISSION_GATE for gate in (pod.spec.scheduling_gates or ()))


def pod_request(pod: Any, resource: str) -> int:
    """A pod's effective request of ``resource``, as the scheduler counts it.

    The larger of what its containers run with (plus sidecars, init containers that keep
    running) and what its heaviest init container needs while the sidecars started before it
    run, plus the pod overhead.
    """
    spec = pod.spec
    sidecars = 0
    init_peak = 0
    for container in spec.init_containers or ():
        amount = _container_request(container, resource)
        if container.restart_policy == "Always":
            sidecars += amount
        else:
            init_peak = max(init_peak, sidecars + amount)
    running = sidecars + sum(_container_request(c, resource) for c in spec.containers or ())
    overhead = parse_quantity((spec.overhead or {}).get(resource))
    return max(running, init_peak) + overhead


def _container_request(container: Any, resource: str) -> int:
    resources = container.resources
    if resources is None:
        return 0
    # An extended resource's request defaults to its limit (and must equal it when both are set).
    value = (resources.requests or {}).get(resource)
    if value is None:
        value = (resources.limits or {}).get(resource)
    return parse_quantity(value)


def _unusable(node: Any, tolerations: Sequence[Any]) -> str:
    """Why jobs cannot use this node (``""``: they can)."""
    spec = node.spec
    if spec is not None and spec.unschedulable:
        return "unschedulable (cordoned)"
    conditions = (node.status.conditions if node.status else None) or ()
    ready = next((c for c in conditions if c.type == "Ready"), None)
    if ready is None or ready.status != "True":
        return "not Ready"
    for taint in (spec.taints if spec is not None else None) or ():
        if taint.effect in _BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            shown = f"{taint.key}={taint.value}" if taint.value else taint.key
            return f"taint {shown}:{taint.effect} not tolerated"
    return ""


def tolerates(toleration: Any, taint: Any) -> bool:
    """Kubernetes' rule: effect empty or equal; Exists matches the key (any key when empty); Equal the value."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if (toleration.operator or "Equal") == "Exists":
        return not toleration.key or toleration.key == taint.key
    return bool(toleration.key == taint.key and (toleration.value or "") == (taint.value or ""))


def _candidate_variants(pod: Any, policy: CapacityPolicy, known: list[str]) -> list[str]:
    """Where an admitted pod not yet bound to a node will land, as far as its spec says."""
    labels = (pod.metadata.labels if pod.metadata else None) or {}
    if labels.get(VARIANT_POD_LABEL):
        return [labels[VARIANT_POD_LABEL]]
    if policy.variant:
        return [policy.variant]
    if policy.variant_label:
        selector = (pod.spec.node_selector or {}).get(policy.variant_label)
        if selector is not None:
            variant = policy.variant_of_label_value(selector)
            return [variant] if variant else []
        allowed = _affinity_values(pod, policy.variant_label)
        if allowed is not None:
            return sorted({v for v in (policy.variant_of_label_value(value) for value in allowed) if v})
    return known  # could land on any variant: held against each


def _candidate_slices(pod: Any, known: list[str]) -> list[str]:
    """The TPU slices an admitted pod not yet bound to a node will land on: ours say so by label,
    others by their node selector; else any."""
    labels = (pod.metadata.labels if pod.metadata else None) or {}
    if labels.get(VARIANT_POD_LABEL):
        return [labels[VARIANT_POD_LABEL]]
    found = slice_of_node_labels(pod.spec.node_selector)
    return [found.variant] if found else known


def _affinity_values(pod: Any, key: str) -> list[str] | None:
    """Values of ``key`` the pod's required node affinity allows (``In`` terms), or None if it does not say."""
    affinity = pod.spec.affinity
    node_affinity = affinity.node_affinity if affinity else None
    required = node_affinity.required_during_scheduling_ignored_during_execution if node_affinity else None
    if required is None:
        return None
    values: list[str] = []
    for term in required.node_selector_terms or ():
        term_values = [
            value
            for expression in term.match_expressions or ()
            if expression.key == key and expression.operator == "In"
            for value in expression.values or ()
        ]
        if not term_values:
            return None  # this term allows any variant
        values.extend(term_values)
    return values or None


def parse_quantity(value: Any) -> int:
    """A Kubernetes quantity as a whole number, rounded up (``"8"`` -> 8, ``"500m"`` -> 1); None -> 0."""
    if value is None:
        return 0
    if isinstance(value, int | float):
        return math.ceil(value)
    try:
        amount: Decimal = kubernetes_quantity(str(value).strip())
    except (ValueError, ArithmeticError):
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None
    return math.ceil(amount)


__all__ = [
    "GPU_RESOURCE",
    "KUEUE_ADMISSION_GATE",
    "VARIANT_POD_LABEL",
    "CapacityPolicy",
    "ClusterCapacity",
    "KubernetesAvailability",
    "VariantCapacity",
    "cluster_capacity",
    "holds_capacity",
    "parse_quantity",
    "pod_request",
    "tolerates",
]

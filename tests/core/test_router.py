"""Submit-time classification: pin, then LOCAL, then QUEUE on a capable reachable peer, else REJECT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.availability import LocalBackend, PeerState
from iris_airflow_provider.core.constraints import normalize_advertised, satisfies_all
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.router import Decision, Disposition, classify, local_backends_for
from tests.core.builders import NOW, backend, gpu, peer

STALENESS = 120_000


def job(job_id: str = "/alice/train", **fields: Any) -> JobSpec:
    return parse_job({"job_id": job_id, **fields})


def gpu_job(job_id: str = "/alice/train", variant: str = "h100", count: int = 8, **fields: Any) -> JobSpec:
    return job(job_id, resources={"device": {"type": "gpu", "variant": variant, "count": count}}, **fields)


def local(backend_id: str, total: dict[str, int] | None = None, **attributes: Any) -> LocalBackend:
    advertised = normalize_advertised(
        {k.replace("_", "-"): v if isinstance(v, list) else [v] for k, v in attributes.items()}
    )
    return LocalBackend(backend_id, advertised, total)


def decide(
    spec: JobSpec,
    *,
    local_backends: Sequence[LocalBackend] = (),
    peers: Sequence[PeerState] = (),
    now_ms: int = NOW,
) -> Decision:
    return classify(spec, local_backends=local_backends, peers=peers, now_ms=now_ms, staleness_ms=STALENESS)


TPU_HOST = local("v5p", device_type="tpu", device_variant="v5p-8")
H100_PEER = peer("cw-rno2a", gpu("default", "h100", 8))


class TestPins:
    def test_a_pin_queues_for_that_peer_even_when_the_job_could_run_locally(self):
        spec = job(resources={"device": {"type": "tpu", "variant": "v5p-8", "count": 4}}, target_cluster="cw-rno2a")
        assert decide(spec, local_backends=[TPU_HOST], peers=[H100_PEER]) == Decision(
            Disposition.QUEUE, pinned_peer_id="cw-rno2a"
        )

    def test_a_pin_ignores_what_the_peer_advertises_and_whether_it_is_reachable(self):
        down = peer("cw-rno2a", gpu("default", "h100", 0), reachable=False)
        spec = gpu_job(variant="gb200", regions=["eu-west"], target_cluster="cw-rno2a")
        assert decide(spec, peers=[down]) == Decision(Disposition.QUEUE, pinned_peer_id="cw-rno2a")

    def test_a_cluster_constraint_pins_like_target_cluster(self):
        spec = job(constraints=[{"key": "cluster", "op": "EQ", "value": "cw-rno2a"}])
        assert decide(spec, local_backends=[TPU_HOST], peers=[H100_PEER]).pinned_peer_id == "cw-rno2a"

    def test_a_pin_to_a_peer_that_is_not_configured_is_rejected_naming_it(self):
        decision = decide(gpu_job(target_cluster="cw-nowhere"), peers=[H100_PEER])
        assert decision.disposition is Disposition.REJECT
        assert decision.reason == (
            "Job /alice/train pins cluster 'cw-nowhere', which is not a configured federation peer."
        )

    def test_pin_ids_are_matched_exactly(self):
        # A peer id is a name, not an attribute: the pin keeps its case, and must match as configured.
        upper = peer("CW-A", gpu("default", "h100", 8))
        spec = job(constraints=[{"key": "cluster", "op": "EQ", "value": "CW-A"}])
        assert decide(spec, peers=[upper]) == Decision(Disposition.QUEUE, pinned_peer_id="CW-A")
        assert decide(job(target_cluster="cw-a"), peers=[upper]).disposition is Disposition.REJECT

    def test_pinning_both_a_backend_and_a_cluster_is_rejected(self):
        spec = job(target_cluster="cw-rno2a", constraints=[{"key": "backend", "op": "EQ", "value": "v5p"}])
        decision = decide(spec, local_backends=[TPU_HOST], peers=[H100_PEER])
        assert decision.disposition is Disposition.REJECT
        assert decision.reason == "Job /alice/train pins both a backend and a cluster"


class TestLocal:
    def test_a_job_a_local_backend_can_host_runs_locally(self):
        spec = job(resources={"device": {"type": "tpu", "variant": "v5p-8", "count": 4}})
        decision = decide(spec, local_backends=[TPU_HOST], peers=[H100_PEER])
        assert decision == Decision(Disposition.LOCAL, local_backend_id="v5p")
        assert decision.to_wire(spec.job_id) == {
            "job_id": "/alice/train",
            "disposition": "local",
            "pinned_peer_id": "",
            "reason": "",
        }

    def test_local_is_preferred_over_a_peer_that_could_also_host_it(self):
        local_h100 = local("gpu", device_type="gpu", device_variant="h100")
        assert decide(gpu_job(), local_backends=[local_h100], peers=[H100_PEER]).disposition is Disposition.LOCAL

    def test_a_cpu_job_runs_on_any_local_backend(self):
        # device-type EQ cpu never routes: CPU matches anything.
        assert decide(job(), local_backends=[TPU_HOST]).disposition is Disposition.LOCAL
        explicit_cpu = job(constraints=[{"key": "device-type", "op": "EQ", "value": "cpu"}])
        assert decide(explicit_cpu, local_backends=[TPU_HOST]).disposition is Disposition.LOCAL

    def test_listed_totals_must_cover_the_gate(self):
        small = local("gpu", {"h100": 8}, device_type="gpu", device_variant="h100")
        big = local("gpu", {"h100": 16}, device_type="gpu", device_variant="h100")
        other_token = local("gpu", {"a100": 64}, device_type="gpu", device_variant="h100")
        two_replicas = job(resources={"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 2})
        assert local_backends_for(two_replicas, [small]) == []
        assert local_backends_for(two_replicas, [big]) == [big]
        assert local_backends_for(two_replicas, [other_token]) == []

    def test_a_backend_without_totals_is_checked_on_shape_alone(self):
        for total in (None, {}):
            shape_only = local("gpu", total, device_type="gpu", device_variant="h100")
            huge = job(resources={"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 128})
            assert local_backends_for(huge, [shape_only]) == [shape_only]

    def test_ungated_jobs_ignore_totals(self):
        tpu = local("v5p", {"v5p-8": 0}, device_type="tpu", device_variant="v5p-8")
        spec = job(resources={"device": {"type": "tpu", "variant": "auto", "count": 64}})
        assert local_backends_for(spec, [tpu]) == [tpu]

    def test_a_concrete_tpu_variant_is_gated_by_its_chips_like_a_gpu_variant(self):
        small = local("v5p", {"v5p-16": 8}, device_type="tpu", device_variant="v5p-16")
        one_slice = job(resources={"device": {"type": "tpu", "variant": "v5p-16"}})
        two_slices = job(resources={"device": {"type": "tpu", "variant": "v5p-16"}, "replicas": 2})
        assert local_backends_for(one_slice, [small]) == [small]
        assert local_backends_for(two_slices, [small]) == []

    def test_a_backend_pin_narrows_local_feasibility_to_that_backend(self):
        a = local("a", device_type="gpu", device_variant="h100")
        b = local("b", device_type="gpu", device_variant="h100")
        spec = gpu_job(constraints=[{"key": "backend", "op": "EQ", "value": "b"}])
        assert decide(spec, local_backends=[a, b]) == Decision(Disposition.LOCAL, local_backend_id="b")
        missing = gpu_job(constraints=[{"key": "backend", "op": "EQ", "value": "c"}])
        decision = decide(missing, local_backends=[a, b])
        assert decision.disposition is Disposition.REJECT
        assert "pins local backend 'c', which this cluster does not have" in decision.reason


class TestQueue:
    def test_a_job_some_reachable_peer_could_host_queues_without_choosing_a_peer(self):
        peers = [peer("cw-08a", gpu("default", "gb200", 0)), H100_PEER]
        assert decide(gpu_job(), local_backends=[TPU_HOST], peers=peers) == Decision(Disposition.QUEUE)

    def test_capacity_does_not_matter_at_submit(self):
        full = peer("cw-rno2a", gpu("default", "h100", 0))
        huge = job(resources={"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 512})
        assert decide(huge, peers=[full]).disposition is Disposition.QUEUE

    def test_attributes_are_never_combined_across_backends(self):
        # One backend has the variant, another the region: neither hosts an h100 job in us-east.
        split = peer(
            "cw",
            gpu("gpus", "h100", 8),
            backend("east", free={}, device_type="gpu", device_variant="a100", region="us-east"),
        )
        spec = gpu_job(regions=["us-east"])
        assert decide(spec, peers=[split]).disposition is Disposition.REJECT
        whole = peer(
            "cw", backend("east", free={}, device_type="gpu", device_variant=["a100", "h100"], region="us-east")
        )
        assert decide(spec, peers=[whole]).disposition is Disposition.QUEUE

    def test_a_job_without_routing_constraints_can_go_to_any_reachable_peer(self):
        bare = peer("bare")
        assert decide(job(), peers=[bare]) == Decision(Disposition.QUEUE)
        assert decide(job(), peers=[H100_PEER]) == Decision(Disposition.QUEUE)
        assert decide(job(), peers=[peer("bare", reachable=False)]).disposition is Disposition.REJECT

    def test_non_routing_keys_do_not_keep_a_job_off_a_peer(self):
        spec = gpu_job(
            constraints=[
                {"key": "gpu-count", "op": "EQ", "value": 8},
                {"key": "tpu-topology", "op": "EQ", "value": "2x2x2"},
                {"key": "gpu-variant", "op": "EXISTS"},
            ]
        )
        assert decide(spec, peers=[H100_PEER]).disposition is Disposition.QUEUE

    def test_any_region_does_not_keep_a_job_off_a_peer_without_regions(self):
        assert decide(gpu_job(regions=["*"]), peers=[H100_PEER]).disposition is Disposition.QUEUE
        assert decide(gpu_job(regions=["us-east"]), peers=[H100_PEER]).disposition is Disposition.REJECT

    @pytest.mark.parametrize(
        ("last_contact_ms", "reachable", "disposition"),
        [
            (NOW - STALENESS, True, Disposition.QUEUE),
            (NOW - STALENESS - 1, True, Disposition.REJECT),
            (NOW, False, Disposition.REJECT),
            (NOW + 5, True, Disposition.QUEUE),
        ],
    )
    def test_a_peer_is_unreachable_when_down_or_past_the_staleness_bound(self, last_contact_ms, reachable, disposition):
        only = peer("cw-rno2a", gpu("default", "h100", 8), reachable=reachable, last_contact_ms=last_contact_ms)
        assert decide(gpu_job(), peers=[only]).disposition is disposition


class TestRootOnly:
    def test_a_child_that_would_federate_is_rejected_naming_target_cluster_on_the_root(self):
        decision = decide(gpu_job("/alice/coord/train"), peers=[H100_PEER])
        assert decision.disposition is Disposition.REJECT
        assert "/alice/coord/train is not a root job" in decision.reason
        assert "Set target_cluster on the root job /alice/coord" in decision.reason

    def test_a_pinned_child_is_rejected_too(self):
        decision = decide(gpu_job("/alice/coord/train", target_cluster="cw-rno2a"), peers=[H100_PEER])
        assert decision.disposition is Disposition.REJECT
        assert "target_cluster" in decision.reason

    def test_a_child_that_runs_locally_is_fine(self):
        spec = job("/alice/coord/step", resources={"device": {"type": "tpu", "variant": "v5p-8", "count": 4}})
        assert decide(spec, local_backends=[TPU_HOST], peers=[H100_PEER]).disposition is Disposition.LOCAL

    def test_a_child_nobody_can_host_gets_the_ordinary_unschedulable_reason(self):
        decision = decide(gpu_job("/alice/coord/train", variant="gb200"), peers=[H100_PEER])
        assert decision.disposition is Disposition.REJECT
        assert "is unschedulable" in decision.reason
        assert "target_cluster" not in decision.reason


class TestRejectReasons:
    def test_the_reason_says_what_each_peer_and_local_backend_advertises(self):
        peers = [
            H100_PEER,
            peer("cw-08a", gpu("default", "gb200", 8)),
            peer("cw-down", gpu("default", "h100", 8), reachable=False),
            peer("cw-stale", gpu("default", "h100", 8), last_contact_ms=NOW - 300_000),
            peer("cw-empty"),
        ]
        decision = decide(gpu_job(regions=["us-east"]), local_backends=[TPU_HOST], peers=peers)
        assert decision.disposition is Disposition.REJECT
        assert decision.reason == (
            "Job /alice/train is unschedulable: no local backend or peer can host it "
            "(constraints: device-type EQ gpu, device-variant EQ h100, region EQ us-east). "
            "Local backend v5p: needs device-type EQ gpu, advertises device-type=tpu. "
            "Peer cw-rno2a backend default: needs region EQ us-east, advertises region=nothing. "
            "Peer cw-08a backend default: needs device-variant EQ h100, advertises device-variant=gb200. "
            "Peer cw-down: unreachable. "
            "Peer cw-stale: last heartbeat 300s ago, past the 120s bound. "
            "Peer cw-empty: advertises no backends."
        )

    def test_a_local_backend_too_small_says_how_much_it_has(self):
        small = local("gpu", {"h100": 4}, device_type="gpu", device_variant="h100")
        decision = decide(gpu_job(), local_backends=[small])
        assert "Local backend gpu: needs 8 h100, has 4 in total." in decision.reason

    def test_nothing_configured(self):
        decision = decide(gpu_job())
        assert decision.disposition is Disposition.REJECT
        assert "This cluster has no local backends." in decision.reason
        assert "No federation peers are configured." in decision.reason

    def test_multi_valued_attributes_are_all_shown(self):
        multi = peer("cw", backend("b", free=None, device_type="gpu", device_variant=["a100", "gb200"]))
        assert "advertises device-variant=a100, gb200" in decide(gpu_job(), peers=[multi]).reason


def reference_classify(spec: JobSpec, local_backends: list[LocalBackend], peers: list[PeerState]) -> Disposition:
    """The reference's rules, written out plainly (pins and non-roots aside)."""
    for host in local_backends:
        totals = host.total_amounts or {}
        fits = not totals or all(totals.get(token, 0) >= need for token, need in spec.gate.items())
        if satisfies_all(host.advertised, spec.routing) and fits:
            return Disposition.LOCAL
    for candidate in peers:
        if not candidate.is_reachable(NOW, STALENESS):
            continue
        if not spec.routing or any(satisfies_all(b.advertised, spec.routing) for b in candidate.backends):
            return Disposition.QUEUE
    return Disposition.REJECT


SHAPES = st.fixed_dictionaries(
    {"device-type": st.sampled_from([["gpu"], ["tpu"], ["cpu"]])},
    optional={
        "device-variant": st.lists(st.sampled_from(["h100", "a100", "v5p-8"]), min_size=1, max_size=2, unique=True),
        "region": st.lists(st.sampled_from(["us-east", "us-west"]), min_size=1, max_size=2, unique=True),
    },
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[JobSpec, list[LocalBackend], list[PeerState]]:
    kind = draw(st.sampled_from(["cpu", "gpu", "tpu"]))
    device: dict[str, Any] = {"type": kind}
    if kind == "gpu":
        device |= {"variant": draw(st.sampled_from(["h100", "a100", "auto"])), "count": 8}
    elif kind == "tpu":
        device |= {"variant": draw(st.sampled_from(["v5p-8", "auto"])), "count": 4}
    fields: dict[str, Any] = {"resources": {"device": device}}
    if draw(st.booleans()):
        fields["regions"] = draw(st.sampled_from([["us-east"], ["us-east", "us-west"], ["*"]]))
    spec = job(**fields)
    local_backends = [
        LocalBackend(f"l{i}", normalize_advertised(draw(SHAPES)), draw(st.sampled_from([None, {"h100": 4}])))
        for i in range(draw(st.integers(0, 2)))
    ]
    peers = [
        PeerState(
            f"p{i}",
            draw(st.booleans()),
            draw(st.sampled_from([NOW, NOW - STALENESS - 1])),
            tuple(
                backend(f"b{j}", free=None, **{k.replace("-", "_"): v for k, v in draw(SHAPES).items()})
                for j in range(draw(st.integers(0, 2)))
            ),
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    return spec, local_backends, peers


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_classify_agrees_with_the_plain_reference_rules(scenario):
    spec, local_backends, peers = scenario
    assert decide(spec, local_backends=local_backends, peers=peers).disposition is reference_classify(
        spec, local_backends, peers
    )

"""A job no backend could ever hold: rejected at submit, and plainly explained if it is already queued."""

from __future__ import annotations

from typing import Any

from iris_airflow_provider.core.availability import LocalBackend
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.fit import NeverFits, never_fits
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.router import Disposition, classify
from tests.core.builders import NOW, backend, gpu, peer

STALENESS = 120_000
H100 = {"device-type": ["gpu"], "device-variant": ["h100"]}


def big(count: int = 16, **fields: Any):
    return parse_job(
        {"job_id": "/a/big", "resources": {"device": {"type": "gpu", "variant": "h100", "count": count}}, **fields}
    )


def check(spec, peers, local_backends=()) -> NeverFits | None:
    return never_fits(
        spec.gate,
        spec.routing,
        peers=peers,
        local_backends=local_backends,
        pinned_peer_id=spec.pin,
        now_ms=NOW,
        staleness_ms=STALENESS,
    )


def decide(spec, peers, local_backends=()):
    return classify(spec, local_backends=local_backends, peers=peers, now_ms=NOW, staleness_ms=STALENESS)


def h100(backend_id: str, free: int, total: int | None):
    return gpu(backend_id, "h100", free, total=None if total is None else {"h100": total})


class TestAtSubmit:
    def test_a_job_bigger_than_every_matching_total_is_rejected_naming_the_need_and_the_largest(self):
        peers = [peer("cw-h100", h100("default", 8, 8)), peer("cw-small", h100("a", 4, 4), h100("b", 0, 6))]
        decision = decide(big(), peers)
        assert decision.disposition is Disposition.REJECT
        assert decision.reason == (
            "Job /a/big needs 16 h100 on one backend; the largest that can host it is cw-h100/default with 8 in total"
        )

    def test_the_replicas_count_and_totals_are_never_summed_across_backends(self):
        peers = [peer("cw", h100("a", 8, 8), h100("b", 8, 8))]
        spec = parse_job(
            {
                "job_id": "/a/big",
                "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 2},
            }
        )
        assert decide(spec, peers).disposition is Disposition.REJECT

    def test_one_backend_large_enough_anywhere_is_enough_to_queue(self):
        peers = [peer("cw-h100", h100("default", 0, 8)), peer("cw-big", h100("default", 0, 64))]
        assert decide(big(), peers).disposition is Disposition.QUEUE

    def test_a_shape_only_backend_counts_as_possibly_large_enough(self):
        peers = [peer("cw-h100", h100("default", 8, 8)), peer("cw-shape", gpu("default", "h100", None))]
        assert decide(big(), peers).disposition is Disposition.QUEUE
        assert check(big(), peers) is None

    def test_a_backend_without_a_total_for_the_variant_counts_as_possibly_large_enough(self):
        peers = [peer("cw-h100", h100("default", 8, None))]  # free reported, no total
        assert decide(big(), peers).disposition is Disposition.QUEUE

    def test_a_block_of_a_version_we_do_not_understand_counts_as_possibly_large_enough(self):
        peers = [peer("cw", gpu("default", "h100", 8, total={"h100": 8}, version=3))]
        assert decide(big(), peers).disposition is Disposition.QUEUE

    def test_a_total_of_zero_is_a_total(self):
        peers = [peer("cw", h100("default", 0, 0))]
        assert check(big(), peers) == NeverFits(16, "h100", "cw/default", 0)

    def test_an_unreachable_or_stale_peer_is_not_a_matching_backend(self):
        peers = [
            peer("cw-h100", h100("default", 8, 8)),
            peer("cw-gone", h100("default", 64, 64), reachable=False),
            peer("cw-stale", h100("default", 64, 64), last_contact_ms=NOW - STALENESS - 1),
        ]
        assert check(big(), peers) == NeverFits(16, "h100", "cw-h100/default", 8)

    def test_a_local_backend_counts_and_is_named_as_such(self):
        local = LocalBackend("gpu", normalize_advertised(H100), {"h100": 12})
        peers = [peer("cw-h100", h100("default", 8, 8))]
        decision = decide(big(), peers, [local])
        assert decision.disposition is Disposition.REJECT
        assert decision.reason.endswith("the largest that can host it is local backend gpu with 12 in total")
        local_without_totals = LocalBackend("gpu", normalize_advertised(H100), None)
        assert check(big(), peers, [local_without_totals]) is None

    def test_backends_that_do_not_match_the_routing_constraints_do_not_count(self):
        peers = [peer("cw", h100("default", 8, 8), gpu("a100s", "a100", 64, total={"a100": 64}))]
        assert check(big(), peers) == NeverFits(16, "h100", "cw/default", 8)

    def test_a_pinned_job_is_judged_on_its_pin_alone(self):
        peers = [peer("cw-small", h100("default", 8, 8)), peer("cw-big", h100("default", 64, 64))]
        pinned = big(target_cluster="cw-small")
        decision = decide(pinned, peers)
        assert (decision.disposition, decision.pinned_peer_id) == (Disposition.REJECT, "cw-small")
        assert decision.reason.endswith("cw-small/default with 8 in total")
        assert decide(big(target_cluster="cw-big"), peers).disposition is Disposition.QUEUE
        # A pin to a peer that advertises nothing matching (force-routed) or is unreachable still queues.
        assert decide(big(target_cluster="bare"), [*peers, peer("bare")]).disposition is Disposition.QUEUE
        gone = [peer("cw-small", h100("default", 8, 8), reachable=False)]
        assert decide(pinned, gone).disposition is Disposition.QUEUE

    def test_ungated_jobs_are_never_rejected_for_size(self):
        cpu = parse_job({"job_id": "/a/cpu"})
        assert check(cpu, [peer("cw", backend("cpu", free={}, total={"cpu": 0}, device_type="cpu"))]) is None

    def test_nothing_matching_is_left_to_the_shape_rules(self):
        assert check(big(), [peer("cw", gpu("default", "a100", 64, total={"a100": 64}))]) is None

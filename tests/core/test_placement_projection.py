"""The placement projection a job's row keeps gives placement exactly what parsing its spec gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_projection import candidate, parse_projection, projection
from tests.core.test_job_model_fuzz import jobs, parsed_or_refused

SUBMITTED = 1_700_000_000_000


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(jobs(), st.frozensets(st.sampled_from(["cw-a", "cw-b", "cw-c"])))
def test_the_projection_gives_the_candidate_the_parsed_spec_gives(document: dict[str, Any], avoided: frozenset) -> None:
    spec = parsed_or_refused(document)
    if spec is None:
        return
    stored = projection(spec)
    from_columns = candidate(
        spec.job_id, spec.priority_band.wire_name, SUBMITTED, spec.scheduling_deadline_ms, stored, avoided
    )
    assert from_columns == Candidate.from_job(spec, SUBMITTED, avoided)


def test_a_gated_pinned_job_in_two_regions_keeps_its_pin_routing_and_gate() -> None:
    spec = parse_job(
        {
            "job_id": "/alice/train",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 2},
            "constraints": [{"key": "preemptible", "op": "EQ", "value": True}],
            "regions": ["us-east", "eu-west"],
            "target_cluster": "cw-a",
            "priority_band": "production",
        }
    )
    pin, routing, gate, prefer = parse_projection(projection(spec))
    assert (pin, routing, gate, prefer) == (spec.pin, spec.routing, (("h100", 16),), ())
    assert {c.key for c in routing} == {"device-type", "device-variant", "preemptible", "region"}


def test_a_projection_of_another_version_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="placement projection version 2; accepted: 1"):
        parse_projection('{"v":2,"pin":"","routing":[],"gate":[]}')


def test_a_preference_travels_in_the_projection_and_one_written_without_it_reads_as_none() -> None:
    spec = parse_job({"job_id": "/alice/coordinator", "prefer": ["H100", "a100", "h100"]})
    stored = projection(spec)
    assert parse_projection(stored)[3] == ("h100", "a100")  # lowercased, once each, in order
    assert '"prefer"' not in projection(parse_job({"job_id": "/alice/plain"}))
    assert parse_projection('{"v":1,"pin":"","routing":[],"gate":[]}')[3] == ()

"""The job model: what parse_job accepts, what it derives, and how it reports bad input."""

from __future__ import annotations

from typing import Any

import pytest

from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import Constraint, Op, make_constraint
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import parse_job


def gpu(variant: str = "h100", count: int = 8, replicas: int = 1) -> dict[str, Any]:
    return {"device": {"type": "gpu", "variant": variant, "count": count}, "replicas": replicas}


def problems(data: dict[str, Any], path: str = "") -> dict[str, str]:
    with pytest.raises(SpecError) as error:
        parse_job(data, path=path)
    return {p.path: p.message for p in error.value.problems}


def test_a_full_job_parses_into_its_fields():
    job = parse_job(
        {
            "job_id": "/alice/train",
            "command": ["python", "train.py"],
            "image": "ghcr.io/marin/train:1",
            "env": {"MARIN_PREFIX": "s3://bucket", "_X1": "y"},
            "resources": {**gpu(count=8, replicas=2), "cpu": 16, "memory": "64Gi"},
            "constraints": [{"key": "zone", "op": "EQ", "values": ["us-east-02a"]}],
            "priority_band": "PRIORITY_BAND_BATCH",
            "target_cluster": None,
            "parent_job_id": None,
            "scheduling_deadline_ms": 5_000,
        }
    )
    assert job.command == ("python", "train.py")
    assert job.image == "ghcr.io/marin/train:1"
    assert job.env == {"MARIN_PREFIX": "s3://bucket", "_X1": "y"}
    assert job.resources.cpu == 16
    assert job.resources.memory == 64 * 2**30
    assert job.resources.replicas == 2
    assert job.priority_band is Band.BATCH
    assert job.pin == ""
    assert job.scheduling_deadline_ms == 5_000
    assert job.is_root
    assert job.gate == {"h100": 16}
    assert job.routing == (
        Constraint("device-type", Op.EQ, ("gpu",)),
        Constraint("device-variant", Op.EQ, ("h100",)),
        Constraint("zone", Op.EQ, ("us-east-02a",)),
    )


def test_defaults_describe_a_plain_cpu_job():
    job = parse_job({"job_id": "/alice/report"})
    assert job.resources.device.type == "cpu"
    assert job.resources.device.variant == "auto"
    assert job.resources.device.count == 0
    assert job.resources.replicas == 1
    assert job.priority_band is Band.INTERACTIVE
    assert (job.routing, job.gate, job.pin, job.regions) == ((), {}, "", None)


def test_a_command_string_is_a_shell_command_line():
    assert parse_job({"job_id": "/a/b", "command": "echo hi && ls"}).command == ("/bin/sh", "-c", "echo hi && ls")


def test_parse_job_returns_an_already_parsed_job_unchanged():
    job = parse_job({"job_id": "/a/b"})
    assert parse_job(job) is job


class TestJobIds:
    @pytest.mark.parametrize("job_id", ["/alice/train", "/alice/train/child", "/a/b/c/d", "/alice@x.ai/run-1"])
    def test_accepted(self, job_id):
        assert parse_job({"job_id": job_id}).job_id == job_id

    @pytest.mark.parametrize("job_id", ["alice/train", "/alice", "/alice/", "//train", "/alice//x", "/al ice/x", ""])
    def test_refused(self, job_id):
        assert "must look like /<user>/<name>" in problems({"job_id": job_id})["job_id"]

    def test_roots_and_children(self):
        root = parse_job({"job_id": "/alice/coord"})
        child = parse_job({"job_id": "/alice/coord/train/step", "parent_job_id": "/alice/coord/train"})
        assert root.is_root and root.inferred_parent is None and root.root_job_id == "/alice/coord"
        assert not child.is_root
        assert child.inferred_parent == "/alice/coord/train"
        assert child.root_job_id == "/alice/coord"

    def test_parent_job_id_must_be_the_parent_path(self):
        assert problems({"job_id": "/a/b/c", "parent_job_id": "/a/x"}) == {
            "parent_job_id": "must be the parent path of job_id (/a/b)"
        }
        assert "it is a root job" in problems({"job_id": "/a/b", "parent_job_id": "/a"})["parent_job_id"]


class TestDevices:
    def test_gpu_and_tpu_need_at_least_one_device_per_replica(self):
        for kind, variant in (("gpu", "x"), ("tpu", "auto")):
            found = problems({"job_id": "/a/b", "resources": {"device": {"type": kind, "variant": variant}}})
            assert found == {"resources.device.count": f"must be >= 1 for a {kind} device"}

    def test_a_tpu_variant_must_be_a_slice_the_table_knows(self):
        found = problems({"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "h100", "count": 4}}})
        assert found == {
            "resources.device.variant": "must be a TPU variant of a known family "
            "(v4-N, v5litepod-N (or v5e-N), v5p-N, v6e-N) or auto"
        }
        found = problems({"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "v5p-12"}}})
        assert found == {
            "resources.device.variant": "must be a v5p slice v5p-N, N (TensorCores) one of "
            "8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288"
        }

    def test_a_tpu_count_is_the_slices_chips_per_host_and_defaults_to_it(self):
        job = parse_job({"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "V5E-16"}}})
        assert (job.resources.device.variant, job.resources.device.count) == ("v5litepod-16", 4)
        assert (
            parse_job(
                {"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "v6e-8"}}}
            ).resources.device.count
            == 8
        )
        found = problems({"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "v5p-16", "count": 8}}})
        assert found == {
            "resources.device.count": "must be 4 for a v5p-16 (its chips per host; a slice is taken whole)"
        }

    def test_a_cpu_device_has_variant_auto_and_no_count(self):
        found = problems({"job_id": "/a/b", "resources": {"device": {"type": "cpu", "variant": "h100", "count": 2}}})
        assert found == {
            "resources.device.variant": "must be auto for a cpu device",
            "resources.device.count": "must be 0 for a cpu device",
        }

    def test_an_unknown_device_type_names_the_accepted_ones(self):
        found = problems({"job_id": "/a/b", "resources": {"device": {"type": "fpga", "count": 1}}})
        assert found["resources.device.type"] == "must be one of: cpu, gpu or tpu"

    def test_replicas_must_be_positive(self):
        assert problems({"job_id": "/a/b", "resources": {"replicas": 0}}) == {"resources.replicas": "must be >= 1"}

    def test_device_type_and_variant_are_lowercased(self):
        job = parse_job({"job_id": "/a/b", "resources": {"device": {"type": "GPU", "variant": " H100 ", "count": 2}}})
        assert (job.resources.device.type, job.resources.device.variant) == ("gpu", "h100")
        assert job.gate == {"h100": 2}
        assert Constraint("device-variant", Op.EQ, ("h100",)) in job.routing

    @pytest.mark.parametrize(
        ("memory", "expected"),
        [
            (1024, 1024),
            ("16Gi", 16 * 2**30),
            ("512Mi", 512 * 2**20),
            ("2G", 2 * 10**9),
            ("1.5Gi", 3 * 2**29),
            ("16GiB", 16 * 2**30),
            ("100", 100),
        ],
    )
    def test_memory_takes_bytes_or_quantities(self, memory, expected):
        assert parse_job({"job_id": "/a/b", "resources": {"memory": memory}}).resources.memory == expected

    @pytest.mark.parametrize("memory", ["lots", "-1Gi", "16Xi", True, -5])
    def test_bad_memory_is_refused(self, memory):
        assert "resources.memory" in problems({"job_id": "/a/b", "resources": {"memory": memory}})


class TestGate:
    def test_a_concrete_gpu_gates_on_every_replica(self):
        assert parse_job({"job_id": "/a/b", "resources": gpu("H100", 8, 3)}).gate == {"h100": 24}

    @pytest.mark.parametrize(
        "resources",
        [
            {},
            gpu("auto", 8, 2),
            {"device": {"type": "tpu", "variant": "auto", "count": 4}, "replicas": 2},
        ],
        ids=["cpu", "gpu-auto", "tpu-auto"],
    )
    def test_cpu_and_auto_are_ungated(self, resources):
        assert parse_job({"job_id": "/a/b", "resources": resources}).gate == {}

    @pytest.mark.parametrize(
        ("variant", "replicas", "chips"),
        [("v5p-8", 1, 4), ("v5p-16", 1, 8), ("v5p-16", 2, 16), ("v6e-16", 1, 16), ("v5litepod-8", 3, 24)],
    )
    def test_a_concrete_tpu_variant_is_gated_by_the_chips_of_all_its_slices(self, variant, replicas, chips):
        resources = {"device": {"type": "tpu", "variant": variant}, "replicas": replicas}
        assert parse_job({"job_id": "/a/b", "resources": resources}).gate == {variant: chips}


class TestDerivedConstraints:
    def test_gpu_and_tpu_derive_device_type_and_a_concrete_variant(self):
        tpu = parse_job({"job_id": "/a/b", "resources": {"device": {"type": "tpu", "variant": "V5P-8", "count": 4}}})
        assert tpu.routing == (
            Constraint("device-type", Op.EQ, ("tpu",)),
            Constraint("device-variant", Op.EQ, ("v5p-8",)),
        )
        auto = parse_job({"job_id": "/a/b", "resources": gpu("auto", 1)})
        assert auto.routing == (Constraint("device-type", Op.EQ, ("gpu",)),)

    def test_an_explicit_canonical_constraint_replaces_the_derived_one(self):
        job = parse_job(
            {
                "job_id": "/a/b",
                "resources": gpu("h100", 8),
                "constraints": [{"key": "device-variant", "op": "IN", "values": ["H100", "A100"]}],
            }
        )
        assert job.routing == (
            Constraint("device-type", Op.EQ, ("gpu",)),
            Constraint("device-variant", Op.IN, ("h100", "a100")),
        )
        assert job.gate == {"h100": 8}  # the gate follows the requested device, not the constraint

    def test_non_routing_constraints_stay_on_the_job_but_do_not_route(self):
        job = parse_job(
            {
                "job_id": "/a/b",
                "resources": gpu("h100", 8),
                "constraints": [{"key": "gpu-count", "op": "GE", "value": 8}, {"key": "tpu-name", "op": "EXISTS"}],
            }
        )
        assert make_constraint("gpu-count", "GE", [8]) in job.effective_constraints
        assert [c.key for c in job.routing] == ["device-type", "device-variant"]

    def test_value_is_shorthand_for_one_value(self):
        job = parse_job({"job_id": "/a/b", "constraints": [{"key": "zone", "op": "eq", "value": " A "}]})
        assert job.routing == (Constraint("zone", Op.EQ, ("a",)),)
        both = problems({"job_id": "/a/b", "constraints": [{"key": "zone", "op": "EQ", "value": "a", "values": []}]})
        assert both == {"constraints[0]": "give value or values, not both"}

    def test_constraint_errors_name_the_constraint_and_what_is_accepted(self):
        found = problems(
            {
                "job_id": "/a/b",
                "constraints": [
                    {"key": "region", "op": "GT", "values": ["x"]},
                    {"key": "tpu-name", "op": "LE", "values": ["v5p"]},
                    {"key": "zone", "op": "IN", "values": []},
                    {"key": "zone", "op": "MAYBE", "values": ["x"]},
                ],
            }
        )
        assert found == {
            "constraints[0].op": "GT is not allowed for key 'region'; accepted: EQ, EXISTS, IN",
            "constraints[1].values": "LE compares numbers only, got 'v5p'; use EQ, NE or IN for strings",
            "constraints[2].values": "IN takes at least one value",
            "constraints[3].op": "unknown op 'MAYBE'; accepted: EQ, NE, EXISTS, NOT_EXISTS, GT, GE, LT, LE, IN",
        }


class TestRegions:
    def test_one_region_is_eq_and_several_are_in(self):
        one = parse_job({"job_id": "/a/b", "regions": ["US-East"]})
        several = parse_job({"job_id": "/a/b", "regions": ["us-east", "us-west"]})
        assert one.routing == (Constraint("region", Op.EQ, ("us-east",)),)
        assert several.routing == (Constraint("region", Op.IN, ("us-east", "us-west")),)

    def test_any_region_never_becomes_a_routing_constraint(self):
        job = parse_job({"job_id": "/a/b", "regions": ["*"], "resources": gpu()})
        assert all(c.key != "region" for c in job.effective_constraints)

    def test_any_region_suppresses_a_default_region(self):
        assert parse_job({"job_id": "/a/b", "regions": ["*"]}).with_default_region("us-central2").routing == ()

    def test_a_default_region_applies_only_to_a_job_that_names_none(self):
        plain = parse_job({"job_id": "/a/b"}).with_default_region(" US-Central2 ")
        assert plain.routing == (Constraint("region", Op.EQ, ("us-central2",)),)
        named = parse_job({"job_id": "/a/b", "regions": ["us-east"]}).with_default_region("us-central2")
        assert named.routing == (Constraint("region", Op.EQ, ("us-east",)),)
        constrained = parse_job({"job_id": "/a/b", "constraints": [{"key": "region", "op": "EQ", "value": "eu"}]})
        assert constrained.with_default_region("us-central2").routing == (Constraint("region", Op.EQ, ("eu",)),)
        assert parse_job({"job_id": "/a/b"}).with_default_region("").routing == ()

    @pytest.mark.parametrize(
        ("regions", "message"),
        [
            ([], "must list region names"),
            (["us-east", " "], "must list region names"),
            (["*", "us-east"], "cannot be combined with named regions"),
        ],
    )
    def test_bad_regions(self, regions, message):
        assert message in problems({"job_id": "/a/b", "regions": regions})["regions"]

    def test_regions_and_a_region_constraint_are_exclusive(self):
        found = problems(
            {"job_id": "/a/b", "regions": ["us-east"], "constraints": [{"key": "region", "op": "EQ", "value": "eu"}]}
        )
        assert found == {"regions": "give regions or a region constraint, not both"}


class TestBands:
    @pytest.mark.parametrize(
        ("raw", "band"),
        [
            ("interactive", Band.INTERACTIVE),
            ("BATCH", Band.BATCH),
            ("PRIORITY_BAND_PRODUCTION", Band.PRODUCTION),
            ("priority_band_batch", Band.BATCH),
            (" Priority ", Band.PRIORITY),
            ("UNSPECIFIED", Band.INTERACTIVE),
            ("PRIORITY_BAND_UNSPECIFIED", Band.INTERACTIVE),
        ],
    )
    def test_band_names(self, raw, band):
        assert parse_job({"job_id": "/a/b", "priority_band": raw}).priority_band is band

    @pytest.mark.parametrize("raw", ["urgent", "PRIORITY_BAND_INHERIT", "", 3])
    def test_unknown_bands_are_refused_naming_the_accepted_ones(self, raw):
        message = problems({"job_id": "/a/b", "priority_band": raw})["priority_band"]
        if isinstance(raw, str):
            assert "accepted: production, priority, interactive, batch, unspecified" in message
        else:
            assert "band name" in message

    def test_the_band_serializes_by_its_wire_name(self):
        assert parse_job({"job_id": "/a/b", "priority_band": "batch"}).model_dump()["priority_band"] == (
            "PRIORITY_BAND_BATCH"
        )


class TestPins:
    @pytest.mark.parametrize("target", [None, "", "   "])
    def test_null_or_blank_target_cluster_is_no_pin(self, target):
        assert parse_job({"job_id": "/a/b", "target_cluster": target}).pin == ""

    def test_target_cluster_pins(self):
        assert parse_job({"job_id": "/a/b", "target_cluster": " cw-rno2a "}).pin == "cw-rno2a"

    def test_a_cluster_constraint_is_a_pin_too(self):
        job = parse_job({"job_id": "/a/b", "constraints": [{"key": "cluster", "op": "EQ", "value": "cw-rno2a"}]})
        assert job.pin == "cw-rno2a"
        assert job.routing == ()

    def test_the_same_pin_given_both_ways_is_not_a_conflict(self):
        job = parse_job(
            {
                "job_id": "/a/b",
                "target_cluster": "CW-Rno2a",
                "constraints": [{"key": "cluster", "op": "EQ", "value": "CW-Rno2a"}],
            }
        )
        assert job.pin == "CW-Rno2a"

    def test_conflicting_pins_are_an_input_error(self):
        found = problems(
            {"job_id": "/a/b", "target_cluster": "a", "constraints": [{"key": "cluster", "op": "EQ", "value": "b"}]}
        )
        assert found == {"target_cluster": "conflicting pins a, b (target_cluster and cluster constraints)"}
        found = problems(
            {
                "job_id": "/a/b",
                "constraints": [
                    {"key": "cluster", "op": "EQ", "value": "a"},
                    {"key": "cluster", "op": "EQ", "value": "b"},
                ],
            }
        )
        assert "conflicting pins a, b" in found["target_cluster"]

    def test_a_backend_constraint_is_a_local_backend_pin(self):
        job = parse_job({"job_id": "/a/b", "constraints": [{"key": "backend", "op": "EQ", "value": "GPU-Pool"}]})
        assert (job.backend_pin, job.pin, job.routing) == ("GPU-Pool", "", ())


class TestBadInput:
    def test_one_error_names_each_bad_field_with_its_path(self):
        with pytest.raises(SpecError) as error:
            parse_job(
                {
                    "job_id": "train",
                    "env": {"1BAD": "x"},
                    "resources": {**gpu("h100", 0), "replicas": 0},
                    "priority_band": "urgent",
                    "scheduling_deadline_ms": -1,
                },
                path="jobs[3]",
            )
        found = {p.path: p.message for p in error.value.problems}
        assert set(found) == {
            "jobs[3].job_id",
            "jobs[3].env",
            "jobs[3].resources.device.count",
            "jobs[3].resources.replicas",
            "jobs[3].priority_band",
            "jobs[3].scheduling_deadline_ms",
        }
        assert found["jobs[3].resources.device.count"].startswith("must be >= 1")
        assert "jobs[3].resources.device.count: must be >= 1" in str(error.value)
        assert len(str(error.value).splitlines()) == 6

    def test_an_unknown_field_lists_the_accepted_fields(self):
        found = problems({"job_id": "/a/b", "gpus": 8, "resource": {}})
        assert found == {
            "": "unknown field(s) gpus, resource; accepted: job_id, command, image, env, files, bundle, resources, "
            "constraints, regions, priority_band, prefer, ports, target_cluster, parent_job_id, "
            "scheduling_deadline_ms, on_peer_lost, start_timeout_seconds"
        }

    def test_unknown_fields_are_reported_with_the_other_problems_not_instead_of_them(self):
        found = problems(
            {"job_id": "/a/b", "gpus": 8, "resources": {"device": {"type": "gpu", "counts": 8}}}, path="jobs[0]"
        )
        assert set(found) == {"jobs[0]", "jobs[0].resources.device", "jobs[0].resources.device.count"}
        assert found["jobs[0]"].startswith("unknown field(s) gpus; accepted: job_id,")
        assert found["jobs[0].resources.device"] == "unknown field(s) counts; accepted: type, variant, count"
        assert found["jobs[0].resources.device.count"] == "must be >= 1 for a gpu device"

    @pytest.mark.parametrize(
        ("data", "path"),
        [
            ({"job_id": "/a/b", "env": {"A": 1}}, "env.A"),
            ({"job_id": "/a/b", "command": [1]}, "command[0]"),
            ({"job_id": "/a/b", "resources": {"cpu": -1}}, "resources.cpu"),
            ({"job_id": "/a/b", "constraints": [{"op": "EQ"}]}, "constraints[0].key"),
            ({"job_id": "/a/b", "target_cluster": 5}, "target_cluster"),
            ({}, "job_id"),
        ],
    )
    def test_each_kind_of_bad_field_is_named(self, data, path):
        assert path in problems(data)

    def test_a_job_is_immutable(self):
        job = parse_job({"job_id": "/a/b"})
        with pytest.raises(ValueError, match="frozen"):
            job.image = "other"  # type: ignore[misc]
        assert job.image == ""


def test_the_lifecycle_fields_name_what_they_accept():
    found = problems({"job_id": "/a/b", "on_peer_lost": "retry", "start_timeout_seconds": -5}, path="job")
    assert found == {
        "job.on_peer_lost": "must be one of: fail or requeue",
        "job.start_timeout_seconds": "must be >= 0",
    }
    job = parse_job({"job_id": "/a/b"})
    assert (job.on_peer_lost, job.start_timeout_seconds) == ("fail", None)  # the cluster's timeout applies


def test_the_lifecycle_fields_stay_with_the_parent():
    from iris_airflow_provider.peers.base import Handoff
    from iris_airflow_provider.peers.wire import HandoffRequest

    lifecycle = {"on_peer_lost": "requeue", "start_timeout_seconds": 60}
    spec = parse_job({"job_id": "/a/b", "command": "true", **lifecycle, "prefer": ["h100"]})
    sent = HandoffRequest.of(Handoff("/a/b", "n", spec, "", "marin", "a", "a", 1)).spec
    assert (
        "on_peer_lost" not in sent
        and "start_timeout_seconds" not in sent
        and "prefer" not in sent  # a placement hint for this cluster's pass: a peer has no use for it
        and sent["command"] == ["/bin/sh", "-c", "true"]
    )

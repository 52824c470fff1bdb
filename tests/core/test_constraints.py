"""Constraints: which keys route, how each op matches advertised attributes, and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core.constraints import (
    BACKEND_KEY,
    CLUSTER_KEY,
    REGISTRY,
    ROUTING_KEYS,
    Constraint,
    ConstraintError,
    Op,
    device_constraints,
    directive,
    make_constraint,
    merge_constraints,
    normalize_advertised,
    routing_constraints,
    satisfies,
    satisfies_all,
)

NON_ROUTING_KEYS = ("gpu-count", "tpu-name", "tpu-worker-id", "tpu-topology", "tpu-vm-count", "gpu-variant")


def advertised(**attributes: list[str | int | bool]) -> dict[str, tuple[str | int | float, ...]]:
    return normalize_advertised({key.replace("_", "-"): values for key, values in attributes.items()})


class TestWhichKeysRoute:
    def test_exactly_the_five_canonical_keys_route(self):
        assert set(ROUTING_KEYS) == {"device-type", "device-variant", "preemptible", "region", "zone"}

    @pytest.mark.parametrize("key", NON_ROUTING_KEYS)
    def test_consumables_and_tpu_keys_are_known_but_do_not_route(self, key):
        assert key in REGISTRY
        assert not REGISTRY[key].routing
        integer_keys = ("gpu-count", "tpu-vm-count", "tpu-worker-id")
        kept = routing_constraints([make_constraint(key, "EQ", [8 if key in integer_keys else "x"])])
        assert kept == ()

    def test_gpu_count_does_not_change_routing(self):
        # H100x1 and H100x8 route identically: the count is the gate's business, not routing's.
        base = [make_constraint("device-type", "EQ", ["gpu"]), make_constraint("device-variant", "EQ", ["h100"])]
        one = routing_constraints([*base, make_constraint("gpu-count", "EQ", [1])])
        eight = routing_constraints([*base, make_constraint("gpu-count", "EQ", [8])])
        assert one == eight == tuple(base)

    def test_directives_and_unknown_keys_do_not_route(self):
        constraints = [
            make_constraint(CLUSTER_KEY, "EQ", ["cw-rno2a"]),
            make_constraint(BACKEND_KEY, "EQ", ["default"]),
            make_constraint("availability:h100", "EXISTS"),
            make_constraint("zone", "EQ", ["us-east-02a"]),
        ]
        assert routing_constraints(constraints) == (make_constraint("zone", "EQ", ["us-east-02a"]),)

    def test_device_type_eq_cpu_is_dropped_but_gpu_is_kept(self):
        cpu = make_constraint("device-type", "EQ", ["CPU"])
        gpu = make_constraint("device-type", "EQ", ["gpu"])
        assert routing_constraints([cpu]) == ()
        assert routing_constraints([gpu]) == (gpu,)


class TestMatching:
    SHAPE = advertised(device_type=["gpu"], device_variant=["h100", "a100"], region=["us-east"], tpu_vm_count=[4])

    @pytest.mark.parametrize(
        ("key", "op", "values", "expected"),
        [
            ("device-variant", "EQ", ["a100"], True),
            ("device-variant", "EQ", ["gb200"], False),
            ("device-variant", "IN", ["gb200", "h100"], True),
            ("device-variant", "IN", ["gb200", "v5p-8"], False),
            ("region", "EXISTS", [], True),
            ("tpu-topology", "NOT_EXISTS", [], True),
            ("tpu-vm-count", "NOT_EXISTS", [], False),
            ("tpu-name", "EXISTS", [], False),
            ("tpu-vm-count", "GT", [3], True),
            ("tpu-vm-count", "GT", [4], False),
            ("tpu-vm-count", "GE", [4], True),
            ("tpu-vm-count", "GE", [5], False),
            ("tpu-vm-count", "LT", [5], True),
            ("tpu-vm-count", "LT", [4], False),
            ("tpu-vm-count", "LE", [4], True),
            ("tpu-vm-count", "LE", [3], False),
            ("tpu-vm-count", "NE", [3], True),
            ("tpu-vm-count", "NE", [4], False),
        ],
    )
    def test_each_op_against_an_advertised_shape(self, key, op, values, expected):
        assert satisfies(self.SHAPE, make_constraint(key, op, values)) is expected

    def test_any_advertised_value_satisfies_a_multi_valued_attribute(self):
        # A backend advertising two variants hosts a job wanting either; NE holds if any value differs.
        assert satisfies(self.SHAPE, make_constraint("device-variant", "EQ", ["h100"]))
        assert satisfies(self.SHAPE, make_constraint("device-variant", "EQ", ["a100"]))
        assert satisfies(self.SHAPE, make_constraint("gpu-variant", "NOT_EXISTS"))
        assert satisfies(advertised(tpu_name=["a", "b"]), make_constraint("tpu-name", "NE", ["a"]))
        assert not satisfies(advertised(tpu_name=["a"]), make_constraint("tpu-name", "NE", ["a"]))

    @pytest.mark.parametrize(
        ("op", "values"),
        [
            ("EQ", ["x"]),
            ("NE", ["x"]),
            ("IN", ["x", "y"]),
            ("EXISTS", []),
            ("GT", [1]),
            ("GE", [1]),
            ("LT", [9]),
            ("LE", [9]),
        ],
    )
    def test_a_missing_attribute_fails_every_op_but_not_exists(self, op, values):
        # "Not advertised" is not "different": NE fails too.
        constraint = make_constraint("tpu-worker-id" if op in ("GT", "GE", "LT", "LE") else "tpu-name", op, values)
        assert not satisfies({}, constraint)
        assert not satisfies({constraint.key: ()}, constraint)

    def test_not_exists_holds_for_a_missing_or_empty_attribute(self):
        constraint = make_constraint("tpu-topology", "NOT_EXISTS")
        assert satisfies({}, constraint)
        assert satisfies({"tpu-topology": ()}, constraint)
        assert not satisfies({"tpu-topology": ("2x2x2",)}, constraint)

    def test_a_peer_that_advertises_no_region_satisfies_no_region_constraint(self):
        coreweave = advertised(device_type=["gpu"], device_variant=["h100"])
        for op, values in (("EQ", ["us-east"]), ("IN", ["us-east", "us-west"]), ("EXISTS", [])):
            assert not satisfies(coreweave, make_constraint("region", op, values))

    def test_strings_are_stripped_and_case_insensitive_on_both_sides(self):
        shape = normalize_advertised({" Device-Variant ": ["  H100 "], "region": ["US-East"]})
        assert satisfies(shape, make_constraint("device-variant", "eq", [" h100"]))
        assert satisfies(shape, make_constraint("DEVICE-VARIANT", "EQ", ["H100  "]))
        assert satisfies(shape, make_constraint("region", "in", ["us-west", "us-EAST"]))

    def test_booleans_match_whatever_their_spelling(self):
        shape = normalize_advertised({"preemptible": [True]})
        assert satisfies(shape, make_constraint("preemptible", "EQ", ["TRUE"]))
        assert satisfies(normalize_advertised({"preemptible": ["True"]}), make_constraint("preemptible", "EQ", [True]))
        assert not satisfies(shape, make_constraint("preemptible", "EQ", [False]))

    def test_numeric_strings_compare_as_numbers(self):
        shape = normalize_advertised({"tpu-vm-count": ["8"]})
        assert satisfies(shape, make_constraint("tpu-vm-count", "GE", [8]))
        assert satisfies(shape, make_constraint("tpu-vm-count", "EQ", ["8"]))
        assert not satisfies(shape, make_constraint("tpu-vm-count", "GT", ["8"]))

    def test_an_ordered_op_against_a_non_numeric_advertised_value_is_false_not_an_error(self):
        shape = normalize_advertised({"tpu-vm-count": ["many"]})
        assert not satisfies(shape, make_constraint("tpu-vm-count", "GE", [1]))

    def test_satisfies_all_needs_every_constraint_on_the_same_attributes(self):
        constraints = [make_constraint("device-type", "EQ", ["gpu"]), make_constraint("region", "EQ", ["us-east"])]
        assert satisfies_all(self.SHAPE, constraints)
        assert not satisfies_all(advertised(device_type=["gpu"]), constraints)
        assert satisfies_all({}, [])

    @given(
        st.text(alphabet="abcXYZ-", min_size=1, max_size=6).filter(lambda s: s.strip("-")),
        st.sampled_from([str.upper, str.lower, str.title, lambda s: f"  {s} "]),
    )
    def test_matching_ignores_case_and_surrounding_space(self, value, spelling):
        shape = normalize_advertised({"zone": [value]})
        assert satisfies(shape, make_constraint("zone", "EQ", [spelling(value)]))


class TestRefusals:
    @pytest.mark.parametrize(
        ("key", "op", "accepted"),
        [
            ("region", "GT", "accepted: EQ, EXISTS, IN"),
            ("device-type", "NE", "accepted: EQ, IN"),
            ("device-variant", "EXISTS", "accepted: EQ, IN"),
            ("preemptible", "IN", "accepted: EQ"),
            ("zone", "NOT_EXISTS", "accepted: EQ, IN"),
            (CLUSTER_KEY, "IN", "accepted: EQ"),
        ],
    )
    def test_an_op_the_key_does_not_allow_names_the_accepted_ops(self, key, op, accepted):
        with pytest.raises(ConstraintError, match=f"{op} is not allowed for key '{key}'; {accepted}$"):
            make_constraint(key, op, ["x"] if op != "EXISTS" and op != "NOT_EXISTS" else [])

    def test_an_unknown_op_names_every_op(self):
        with pytest.raises(ConstraintError) as error:
            make_constraint("zone", "LIKE", ["x"])
        assert "accepted: EQ, NE, EXISTS, NOT_EXISTS, GT, GE, LT, LE, IN" in str(error.value)

    @pytest.mark.parametrize("op", ["GT", "GE", "LT", "LE"])
    def test_ordered_ops_on_non_numeric_values_are_refused(self, op):
        with pytest.raises(ConstraintError, match=r"compares numbers only.*EQ, NE or IN"):
            make_constraint("tpu-name", op, ["v5p"])

    @pytest.mark.parametrize(
        ("op", "values", "message"),
        [
            ("EXISTS", ["x"], "EXISTS takes no values, got 1"),
            ("NOT_EXISTS", ["x", "y"], "NOT_EXISTS takes no values, got 2"),
            ("IN", [], "IN takes at least one value"),
            ("EQ", [], "EQ takes exactly one value, got 0"),
            ("NE", ["a", "b"], "NE takes exactly one value, got 2"),
            ("GE", [1, 2], "GE takes exactly one value, got 2"),
        ],
    )
    def test_arity(self, op, values, message):
        with pytest.raises(ConstraintError, match=message):
            make_constraint("tpu-name", op, values)

    def test_arity_accepts_what_it_should(self):
        assert make_constraint("tpu-name", "EXISTS").values == ()
        assert make_constraint("tpu-name", "IN", ["a"]).values == ("a",)
        assert make_constraint("tpu-name", "IN", ["a", "b", "c"]).values == ("a", "b", "c")

    def test_typed_keys_refuse_values_of_the_wrong_type(self):
        with pytest.raises(ConstraintError, match="preemptible takes true or false, got 'yes'"):
            make_constraint("preemptible", "EQ", ["yes"])
        with pytest.raises(ConstraintError, match=r"gpu-count takes integers, got 1\.5"):
            make_constraint("gpu-count", "GE", [1.5])
        assert make_constraint("gpu-count", "GE", ["8"]).values == (8,)

    @pytest.mark.parametrize("key", ["", "   "])
    def test_a_blank_key_is_refused(self, key):
        with pytest.raises(ConstraintError, match="non-empty"):
            make_constraint(key, "EQ", ["x"])

    def test_a_blank_value_is_refused(self):
        with pytest.raises(ConstraintError, match="empty"):
            make_constraint("zone", "EQ", ["  "])


class TestDirectivesAndDerivation:
    def test_directive_returns_the_first_value_of_the_key(self):
        constraints = [
            make_constraint("zone", "EQ", ["a"]),
            make_constraint(CLUSTER_KEY, "EQ", ["cw-rno2a"]),
            make_constraint(CLUSTER_KEY, "EQ", ["cw-other"]),
        ]
        assert directive(constraints, CLUSTER_KEY) == "cw-rno2a"
        assert directive(constraints, BACKEND_KEY) == ""

    def test_peer_and_backend_ids_are_kept_as_written(self):
        # They name a configured peer or backend exactly; they are not attributes to normalize.
        assert directive([make_constraint(CLUSTER_KEY, "EQ", [" CW-Rno2a "])], CLUSTER_KEY) == "CW-Rno2a"
        assert directive([make_constraint(BACKEND_KEY, "EQ", ["007"])], BACKEND_KEY) == "007"

    def test_device_constraints(self):
        assert device_constraints("cpu", "auto") == ()
        assert device_constraints("gpu", "auto") == (Constraint("device-type", Op.EQ, ("gpu",)),)
        assert device_constraints("tpu", "v5p-8") == (
            Constraint("device-type", Op.EQ, ("tpu",)),
            Constraint("device-variant", Op.EQ, ("v5p-8",)),
        )

    def test_an_explicit_canonical_constraint_replaces_the_derived_one(self):
        derived = device_constraints("gpu", "h100")
        variants = make_constraint("device-variant", "IN", ["h100", "a100"])
        count = make_constraint("gpu-count", "EQ", [8])
        assert merge_constraints(derived, [variants, count]) == (derived[0], variants, count)

    def test_a_non_canonical_constraint_does_not_replace_anything(self):
        derived = device_constraints("gpu", "h100")
        explicit = make_constraint("gpu-variant", "EQ", ["a100"])
        assert merge_constraints(derived, [explicit]) == (*derived, explicit)

    def test_str_and_wire_forms(self):
        assert str(make_constraint("region", "IN", ["a", "b"])) == "region IN (a, b)"
        assert str(make_constraint("region", "EXISTS")) == "region EXISTS"
        assert str(make_constraint("gpu-count", "GE", [8])) == "gpu-count GE 8"
        assert make_constraint("Zone", "eq", ["X"]).to_wire() == {"key": "zone", "op": "EQ", "values": ["x"]}

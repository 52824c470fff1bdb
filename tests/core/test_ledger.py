"""The ledger charge rule (core), which both placement and the store apply."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core.ledger import LedgerEntry, charge, charged

KEY = ("cw", "h100")


def entry(epoch: int, **amounts: int) -> LedgerEntry:
    return LedgerEntry(*KEY, epoch, amounts)


def test_a_first_charge_creates_the_entry_at_its_observation():
    assert charged(None, KEY, 100, {"h100": 8}) == entry(100, h100=8)


def test_a_charge_against_the_same_observation_adds_up():
    assert charged(entry(100, h100=8), KEY, 100, {"h100": 8, "a100": 1}) == entry(100, h100=16, a100=1)


def test_an_entry_from_an_older_observation_is_spent_and_the_charge_replaces_it():
    assert charged(entry(100, h100=8, a100=4), KEY, 200, {"h100": 2}) == entry(200, h100=2)


def test_a_charge_against_an_older_observation_adds_and_keeps_the_newer_one():
    """The peer's clock went backwards: the entry is not spent, and keeps its observation."""
    assert charged(entry(200, h100=8), KEY, 100, {"h100": 2}) == entry(200, h100=10)


def test_charging_leaves_the_held_entry_untouched():
    held = entry(100, h100=8)
    charged(held, KEY, 100, {"h100": 8})
    assert held == entry(100, h100=8)


def test_charge_folds_many_charges_sorted_and_without_zero_amounts():
    rows = {KEY: entry(100, h100=8), ("cw", "cpu"): LedgerEntry("cw", "cpu", 50, {"cpu": 0})}
    out = charge(rows, [(KEY, 100, {"h100": 8}), (("aa", "b"), 7, {"tpu": 4}), (("aa", "c"), 7, {})])
    assert out == (LedgerEntry("aa", "b", 7, {"tpu": 4}), entry(100, h100=16))


def test_charge_applies_the_same_rule_as_charged_to_older_rows():
    assert charge({KEY: entry(100, h100=8)}, [(KEY, 200, {"h100": 1})]) == (entry(200, h100=1),)


amounts = st.dictionaries(st.sampled_from(["h100", "a100", "cpu"]), st.integers(1, 64), min_size=1)
charges = st.lists(st.tuples(st.integers(0, 5), amounts), max_size=8)


@given(charges)
def test_folding_charge_over_charges_equals_charging_one_at_a_time(sequence):
    one_by_one = None
    for observation, reserved in sequence:
        one_by_one = charged(one_by_one, KEY, observation, reserved)
    folded = charge({}, [(KEY, observation, reserved) for observation, reserved in sequence])
    assert folded == ((one_by_one,) if one_by_one is not None else ())

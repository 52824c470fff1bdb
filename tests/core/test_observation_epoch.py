"""A backend's observation epoch changes with its numbers, not with every heartbeat."""

from __future__ import annotations

from iris_airflow_provider.core.availability import Availability, settled
from iris_airflow_provider.core.bands import Band


def numbers(epoch: int, free: int = 8, held: int = 0, total: int = 16) -> Availability:
    return Availability(2, epoch, {"h100": free}, {"h100": total}, {Band.BATCH: {"h100": held}} if held else {})


def test_the_first_report_is_a_new_observation():
    assert settled(None, numbers(100)) == numbers(100)


def test_the_same_numbers_again_are_the_same_observation():
    assert settled(numbers(100), numbers(200)).observation_epoch_ms == 100


def test_any_change_of_free_total_or_held_numbers_is_a_new_observation():
    for changed in (numbers(200, free=0), numbers(200, total=24), numbers(200, held=8)):
        assert settled(numbers(100), changed) == changed


def test_a_different_version_is_a_new_observation():
    v1 = Availability(1, 200, {"h100": 8}, {"h100": 16})
    assert settled(numbers(100), v1).observation_epoch_ms == 200

"""The jobs table's one-line summary of what a job asks for."""

from __future__ import annotations

import pytest

from iris_airflow_provider.services.job_views import resources_summary


@pytest.mark.parametrize(
    ("resources", "summary"),
    [
        ({}, "cpu"),
        ({"device": {"type": "gpu", "variant": "h100", "count": 8}}, "8 h100"),
        ({"device": {"type": "gpu", "variant": "h100", "count": 8}, "replicas": 2}, "2 x 8 h100"),
        ({"device": {"type": "gpu", "variant": "auto", "count": 1}}, "1 gpu"),
        # A slice's name says its size: v5p-16 is 2 hosts of 4 chips, not "4 tpu v5p-16".
        ({"device": {"type": "tpu", "variant": "v5p-16", "count": 4}}, "tpu v5p-16"),
        ({"device": {"type": "tpu", "variant": "v5p-16", "count": 4}, "replicas": 2}, "2 x tpu v5p-16"),
        ({"device": {"type": "tpu", "variant": "auto", "count": 4}}, "4 tpu"),
    ],
)
def test_the_summary_names_the_device_the_count_and_the_replicas(resources, summary) -> None:
    assert resources_summary({"resources": resources}) == summary

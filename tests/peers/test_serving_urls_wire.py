"""The serving URLs in a peer's job status (``JobStatus.serving_urls``): optional both ways, and
bounded before the parent even judges them (core/serving.py does that)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.serving import MAX_PORTS, MAX_SERVING_URL_CHARS
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.wire import JobStatus

URL = "https://iris.example.com/proxy/t/cluster=cw-east/eyJ.eyJ.sig/http/"


def status(**extra):
    return JobStatus.model_validate({"job_id": "/alice/llm", "nonce": "n1", "state": "running", **extra})


def test_an_older_peer_reports_none_and_an_older_parent_reads_a_newer_status():
    assert status().serving_urls is None
    assert status().to_report().serving_urls is None
    # What an older parent does with the field: its Body ignores fields it does not know.
    assert "serving_urls" in status(serving_urls={"http": URL}).model_dump()


def test_the_urls_travel_from_the_peers_report_to_the_parents():
    report = JobReport("/alice/llm", "n1", JobState.RUNNING, "cpu", serving_urls={"http": URL})
    assert JobStatus.of(report).to_report().serving_urls == {"http": URL}
    wire = JobStatus.of(report).model_dump(mode="json")
    assert JobStatus.model_validate(wire).serving_urls == {"http": URL}


@pytest.mark.parametrize(
    ("urls", "where"),
    [
        ({f"p{i}": URL for i in range(MAX_PORTS + 1)}, "serving_urls"),
        ({"HTTP": URL}, "serving_urls.HTTP.[key]"),
        ({"1http": URL}, "serving_urls.1http.[key]"),
        ({"h" * 33: URL}, "serving_urls." + "h" * 33 + ".[key]"),
        ({"http": URL + "x" * MAX_SERVING_URL_CHARS}, "serving_urls.http"),
        ({"http": URL + "\x00"}, "serving_urls.http"),
        ({"http": URL + "\n"}, "serving_urls.http"),
        ({"http": 7}, "serving_urls.http"),
    ],
)
def test_a_status_out_of_bounds_is_refused_naming_the_field(urls, where):
    with pytest.raises(ValidationError) as raised:
        status(serving_urls=urls)
    assert where in {".".join(map(str, error["loc"])) for error in raised.value.errors()}


def test_sixteen_ports_at_the_longest_url_are_within_bounds():
    urls = {f"p{i}": "u" * MAX_SERVING_URL_CHARS for i in range(MAX_PORTS)}
    assert status(serving_urls=urls).serving_urls == urls

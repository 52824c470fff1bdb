"""What a job may hand back at ``$IRIS_RESULT``, and how the wire carries it (optional, checked)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pydantic import ValidationError

from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.job_result import MAX_RESULT_BYTES, ResultError, parse_result
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.wire import JobStatus, SyncResponse

REPORT = JobReport("/alice/train", "n1", JobState.SUCCEEDED, "default", exit_code=0)


def test_a_json_document_is_kept_as_written_less_surrounding_whitespace() -> None:
    written = b'\n  {"loss": 1E5,\n "path": "s3://b/\xc3\xa9"}  \n'
    assert parse_result(written) == '{"loss": 1E5,\n "path": "s3://b/\u00e9"}'
    assert json.loads(parse_result(b"[1, 2]")) == [1, 2]


def test_exactly_1_mib_is_accepted_and_one_byte_more_is_refused_with_both_sizes() -> None:
    at_limit = b'"' + b"a" * (MAX_RESULT_BYTES - 2) + b'"'
    assert len(parse_result(at_limit)) == MAX_RESULT_BYTES
    with pytest.raises(ResultError, match=r"holds 1048577 bytes; at most 1048576 bytes \(1 MiB\)"):
        parse_result(at_limit + b" ")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"loss": ', "is not valid JSON: Expecting value at line 1 column 10"),
        (b"", "is not valid JSON: Expecting value at line 1 column 1"),
        (b'{"loss": NaN}', "is not valid JSON: NaN is not a JSON number"),
        (b"[Infinity]", "is not valid JSON: Infinity is not a JSON number"),
        (b'"\xff"', "is not UTF-8 text (byte 1)"),
        (b'{"a": "\\u0000"}', "holds a NUL character"),
        (b'{"\\u0000": 1}', "holds a NUL character"),
    ],
)
def test_what_cannot_be_handed_back_is_refused_saying_why(data: bytes, says: str) -> None:
    with pytest.raises(ResultError, match="The job's result \\(the file at \\$IRIS_RESULT\\)") as raised:
        parse_result(data)
    assert says in str(raised.value)


def test_the_wire_carries_a_result_and_round_trips_it() -> None:
    report = replace(REPORT, result='{"loss": 0.5}')
    assert JobStatus.model_validate_json(JobStatus.of(report).model_dump_json()).to_report() == report


def test_a_status_without_a_result_from_an_older_peer_still_parses() -> None:
    older = {"job_id": "/alice/train", "nonce": "n1", "state": "succeeded", "exit_code": 0, "replicas": []}
    assert JobStatus.model_validate(older).to_report().result is None
    # And an older parent ignores the field: its models ignore what they do not know.
    assert SyncResponse.model_validate({"deltas": [{**older, "result": "[1]"}], "next_cursor": "3"})


@pytest.mark.parametrize("result", ['{"loss": ', '"' + "a" * MAX_RESULT_BYTES + '"'])
def test_a_peer_sending_a_result_that_is_not_one_is_refused(result: str) -> None:
    with pytest.raises(ValidationError, match="result"):
        JobStatus.model_validate({"job_id": "/a/b", "nonce": "n", "state": "succeeded", "result": result})

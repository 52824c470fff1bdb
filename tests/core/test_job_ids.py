"""The one job id rule, and ids derived from any text that always meet it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core.job_ids import JobIdError, check_job_id, derived_job_id, job_id_problem
from iris_airflow_provider.core.limits import MAX_JOB_ID_LENGTH

# The rule restated independently of the module, to test it against.
VALID = re.compile(r"(/[A-Za-z0-9._:+@-]+){2,}")


def meets_the_rule(job_id: str) -> bool:
    segments = job_id.split("/")[1:]
    return (
        VALID.fullmatch(job_id) is not None
        and len(job_id) <= MAX_JOB_ID_LENGTH
        and ".." not in job_id
        and "." not in segments
    )


@pytest.mark.parametrize(
    "job_id",
    [
        "/alice/train",
        "/alice/train/child",
        "/alice@example.com/train.fit.manual__2026-11-29T12:01:11.536489+00:00.2",
        "/a/b.c-d_e:f+g@h",
        "/a/.hidden",
        "/" + "a" * 255 + "/" + "b" * 254,
    ],
)
def test_accepted(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        ("/../..", "it holds '..'"),  # issue 11: admitted by a peer, then never given its run there
        ("/alice/..", "it holds '..'"),
        ("/alice/a..b", "it holds '..'"),  # Airflow refuses '..' anywhere in a run id
        ("/alice/./x", "it has a '.' segment"),
        ("/alice/.", "it has a '.' segment"),
        ("/alice//x", "it has an empty segment"),
        ("/alice/", "it has an empty segment"),
        ("/alice", "it is not a path of two or more segments"),
        ("alice/train", "it is not a path of two or more segments"),
        ("", "it is not a path of two or more segments"),
        ("/alice/train\x00", "it holds U+0000 (NUL)"),
        ("/alice/tr\x1b[2Jain", "it holds '[', U+001B"),
        ("/al ice/x", "it holds U+0020"),
        ("/alice/tr\u202eain", "it holds U+202E"),  # a bidirectional override
        ("/alice/tr~ain", "it holds '~'"),  # the runner's run ids write '/' as '~'
        ("/zoë/train", "it holds 'ë'"),
        ("/alice/" + "x" * MAX_JOB_ID_LENGTH, f"it has {MAX_JOB_ID_LENGTH + 7} characters"),
    ],
)
def test_refused_naming_the_rule_and_what_broke_it(job_id: str, problem: str) -> None:
    assert job_id_problem(job_id) == problem
    with pytest.raises(JobIdError) as refused:
        check_job_id(job_id)
    message = str(refused.value)
    assert message.startswith("must look like /<user>/<name>: two or more segments of ASCII letters")
    assert f"; {problem}: " in message
    assert "\x00" not in message and "\x1b" not in message  # quoted escaped, never echoed raw


def test_a_long_id_is_quoted_cut_short() -> None:
    with pytest.raises(JobIdError) as refused:
        check_job_id("/alice/" + "x" * 100_000)
    assert len(str(refused.value)) < 400


@given(st.text(), st.text())
def test_a_derived_job_id_always_meets_the_rule(user: str, name: str) -> None:
    job_id = derived_job_id(user, name)
    assert meets_the_rule(job_id), job_id
    assert job_id_problem(job_id) is None
    assert derived_job_id(user, name) == job_id  # stable: a retried task finds its job again


def test_a_derived_job_id_keeps_what_the_rule_allows_and_replaces_the_rest() -> None:
    assert derived_job_id("alice@example.com", "train.fit.manual__1.2") == "/alice@example.com/train.fit.manual__1.2"
    assert derived_job_id("alice smith", "etl..load") == "/alice_smith/etl.load"
    assert derived_job_id("", "..") == "/_/_"


def test_long_derived_ids_stay_distinct() -> None:
    long = "x" * 1000
    first, second = derived_job_id("alice", long + "1"), derived_job_id("alice", long + "2")
    assert first != second
    assert len(first) == len(second) == MAX_JOB_ID_LENGTH

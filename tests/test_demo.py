"""The demo's own check, which makes it fail CI when a job ends anywhere or anyhow but as the README shows."""

from __future__ import annotations

from devtools.demo import EXAMPLE_JOBS, PEER_JOB, SERVING_JOB, surprises

JOBS = [*EXAMPLE_JOBS, PEER_JOB, SERVING_JOB]
AS_EXPECTED = [
    ("succeeded", "peer cw-h100/default", "success"),
    ("succeeded", "peer cw-gb200/default", "success"),
    ("succeeded", "peer cw-h100/default", "success"),
    ("succeeded", "marin/cpu", "success"),
    ("succeeded", "peer cw-gb200/default", "success"),
    ("rejected", "-", "failed"),
    ("succeeded", "peer cw-east/default", "success"),
    ("succeeded", "peer cw-east/default", "success"),
]


def test_the_readme_outcomes_pass() -> None:
    assert surprises(JOBS, AS_EXPECTED) == []


def test_a_job_cancelled_on_the_peer_or_a_run_that_disagrees_with_its_job_fails_it() -> None:
    ended = list(AS_EXPECTED)
    ended[6] = ("killed", "peer cw-east/default", "failed")  # issue 12: the runner's reset cancelled it
    ended[3] = ("failed", "marin/cpu", "success")  # a task reporting success for a failed job
    found = surprises(JOBS, ended)
    assert len(found) == 2
    assert "8 x H200 job" in found[1] and "got killed at peer cw-east/default (run failed)" in found[1]
    assert "CPU preprocessing" in found[0] and "expected succeeded at marin/cpu (run success)" in found[0]

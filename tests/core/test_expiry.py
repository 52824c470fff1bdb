"""Expiry of queued jobs past their scheduling deadline (core)."""

from __future__ import annotations

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.expiry import Expiry, expiries, past_deadline
from iris_airflow_provider.core.placement import Candidate

NOW = 1_700_000_000_000


def test_a_deadline_is_missed_only_once_now_is_strictly_past_it():
    assert not past_deadline(None, NOW)
    assert not past_deadline(NOW + 1, NOW)
    assert not past_deadline(NOW, NOW)
    assert past_deadline(NOW - 1, NOW)


def test_expiries_are_the_candidates_past_their_deadline_by_job_id_with_the_seed_error():
    candidates = [("/b/late", NOW - 5), ("/a/none", None), ("/a/late", NOW - 1), ("/c/due", NOW), ("/d/ok", NOW + 9)]
    assert expiries(candidates, NOW) == [Expiry("/a/late", NOW - 1), Expiry("/b/late", NOW - 5)]
    assert expiries(candidates, NOW)[0].error == reasons.SCHEDULING_TIMEOUT
    assert reasons.SCHEDULING_TIMEOUT == "Scheduling timeout exceeded while queued for a federation peer"
    assert expiries([], NOW) == []


def test_placement_expires_candidates_by_the_same_rule():
    for deadline in (None, NOW - 1, NOW, NOW + 1):
        candidate = Candidate("/a/job", Band.BATCH, NOW - 100, deadline_ms=deadline)
        assert candidate.expired(NOW) == past_deadline(deadline, NOW)

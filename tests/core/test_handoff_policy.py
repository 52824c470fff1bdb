"""What a failed delivery leads to: reject, requeue, or retry with exponential backoff and jitter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core.handoff_policy import (
    DELIVERY_BACKOFF_BASE_MS,
    DELIVERY_BACKOFF_MAX_MS,
    DeliveryError,
    Reject,
    Requeue,
    RequeueRules,
    Retry,
    after_delivery_error,
    delivery_backoff_ms,
)

NOW = 10_000_000
RULES = RequeueRules(requeue_after_ms=300_000, avoid_ms=900_000)


def decide(
    error: DeliveryError, *, pinned: bool = False, since: int | None = NOW, attempts: int = 0, jitter: float = 1.0
) -> object:
    return after_delivery_error(
        error, "boom", pinned=pinned, failing_since_ms=since, attempts=attempts, now_ms=NOW, jitter=jitter, rules=RULES
    )


@pytest.mark.parametrize("pinned", [False, True])
def test_a_refusal_rejects_the_handoff_with_the_peers_message(pinned: bool) -> None:
    assert decide(DeliveryError.REFUSED, pinned=pinned, since=NOW - 10**9) == Reject("boom")


def test_an_unpinned_job_the_peer_cannot_take_is_requeued_at_once_and_avoids_it() -> None:
    assert decide(DeliveryError.CANNOT_TAKE) == Requeue(NOW + RULES.avoid_ms)


def test_a_pinned_job_is_never_requeued_it_retries_its_peer() -> None:
    assert decide(DeliveryError.CANNOT_TAKE, pinned=True) == Retry(NOW + DELIVERY_BACKOFF_BASE_MS, 5_000)
    assert isinstance(decide(DeliveryError.TRANSIENT, pinned=True, since=NOW - 10**9), Retry)


def test_a_transient_failure_retries_until_it_has_failed_for_the_requeue_period() -> None:
    assert isinstance(decide(DeliveryError.TRANSIENT, since=NOW - RULES.requeue_after_ms + 1), Retry)
    assert decide(DeliveryError.TRANSIENT, since=NOW - RULES.requeue_after_ms) == Requeue(NOW + RULES.avoid_ms)
    assert isinstance(decide(DeliveryError.TRANSIENT, since=None), Retry)  # never failed before: now


def test_backoff_doubles_per_attempt_up_to_the_maximum_and_jitter_scales_it_by_half_to_all() -> None:
    assert [delivery_backoff_ms(n, 1.0) for n in range(4)] == [5_000, 10_000, 20_000, 40_000]
    assert delivery_backoff_ms(2, 0.0) == 10_000
    assert delivery_backoff_ms(100, 1.0) == DELIVERY_BACKOFF_MAX_MS
    assert decide(DeliveryError.TRANSIENT, attempts=1, jitter=0.5) == Retry(NOW + 7_500, 7_500)


@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0.0, max_value=1.0))
def test_backoff_is_always_between_half_the_base_and_the_maximum(attempts: int, jitter: float) -> None:
    assert DELIVERY_BACKOFF_BASE_MS // 2 <= delivery_backoff_ms(attempts, jitter) <= DELIVERY_BACKOFF_MAX_MS

"""When a cancel of a handoff is settled: a peer's "not found" counts only once no delivery of that
incarnation can still land there."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.cancel_settlement import (
    DELIVERY_CLAIM_MARGIN_MS,
    CancelVerdict,
    after_cancel_answer,
    claim_stale_before,
    delivery_in_flight,
    ends_at_once,
    killed_error,
    never_had_error,
)
from iris_airflow_provider.core.states import HandoffState

NOW = 10_000_000_000
TIMEOUT = 180_000


def verdict(found: bool, claimed: int | None) -> CancelVerdict:
    return after_cancel_answer(found, claimed_at_ms=claimed, now_ms=NOW, delivery_timeout_ms=TIMEOUT)


def test_a_peer_that_killed_the_incarnation_confirms_the_cancel_whatever_the_delivery_does() -> None:
    for claimed in (None, NOW, NOW - 1):
        assert verdict(True, claimed) is CancelVerdict.CONFIRMED


def test_not_found_while_a_delivery_is_in_flight_is_asked_again() -> None:
    assert verdict(False, NOW) is CancelVerdict.ASK_AGAIN
    assert verdict(False, NOW - TIMEOUT - DELIVERY_CLAIM_MARGIN_MS + 1) is CancelVerdict.ASK_AGAIN


def test_not_found_with_no_delivery_in_flight_means_the_peer_never_had_it() -> None:
    assert verdict(False, None) is CancelVerdict.NEVER_HAD
    # A claim whose tick died with it: by now its call has timed out, whatever became of it.
    assert verdict(False, NOW - TIMEOUT - DELIVERY_CLAIM_MARGIN_MS) is CancelVerdict.NEVER_HAD


@given(st.integers(min_value=0, max_value=2 * NOW), st.integers(min_value=1, max_value=10**7))
def test_a_claim_is_in_flight_exactly_until_it_is_stale(claimed: int, timeout: int) -> None:
    in_flight = delivery_in_flight(claimed, NOW, timeout)
    assert in_flight == (claimed > claim_stale_before(NOW, timeout))
    assert not delivery_in_flight(None, NOW, timeout)


@pytest.mark.parametrize(
    ("handoff", "claimed", "attempts", "at_once"),
    [
        (HandoffState.QUEUED, None, 0, True),  # never promoted
        (HandoffState.PENDING, None, 0, True),  # promoted, never sent
        (HandoffState.PENDING, NOW, 0, False),  # a delivery is in flight
        (HandoffState.PENDING, None, 1, False),  # a delivery failed: its answer may have been lost
        (HandoffState.HANDED_OFF, None, 0, False),
        (None, None, 0, False),  # a local or received job: its backend is told
    ],
)
def test_a_cancel_ends_a_job_at_once_only_when_nothing_was_ever_sent(
    handoff: HandoffState | None, claimed: int | None, attempts: int, at_once: bool
) -> None:
    assert ends_at_once(handoff, claimed_at_ms=claimed, delivery_attempts=attempts) is at_once


def test_the_final_message_says_where_the_cancel_took_effect() -> None:
    assert never_had_error(HandoffState.PENDING) == reasons.CANCELLED_BEFORE_HANDOFF
    assert never_had_error(HandoffState.HANDED_OFF) == reasons.CANCELLED_PEER_GONE
    assert killed_error(sent=True, cancel_requested=True, peer_id="cw", reported_error="Cancelled") == (
        "Cancelled on peer cw"
    )
    # Killed for another reason (the peer's own operator, its scheduler): the peer's words stand.
    assert killed_error(sent=True, cancel_requested=False, peer_id="cw", reported_error="OOM") == "OOM"
    assert killed_error(sent=False, cancel_requested=True, peer_id="", reported_error="Cancelled") == "Cancelled"

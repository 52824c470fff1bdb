"""Lost peers: when a peer counts as lost, and what becomes of each job handed off there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.peer_loss import (
    LostEnd,
    LostRequeue,
    OnPeerLost,
    after_peer_lost,
    loss_reason,
    peer_is_lost,
)
from iris_airflow_provider.core.states import JobState

NOW = 10_000_000_000
LOST_MS = 900_000
REASON = loss_reason("cw-h100", configured=True, peer_lost_ms=LOST_MS)


def decide(
    *,
    state: JobState = JobState.PENDING,
    started: bool = False,
    pinned: bool = False,
    cancel: bool = False,
    policy: OnPeerLost = OnPeerLost.FAIL,
) -> object:
    return after_peer_lost(REASON, state=state, started=started, pinned=pinned, cancel_requested=cancel, policy=policy)


def test_a_peer_is_lost_once_unreachable_for_the_whole_period() -> None:
    assert not peer_is_lost(None, NOW, LOST_MS)  # it answers
    assert not peer_is_lost(NOW - LOST_MS + 1, NOW, LOST_MS)
    assert peer_is_lost(NOW - LOST_MS, NOW, LOST_MS)


def test_the_reasons_say_how_long_or_that_it_was_removed() -> None:
    assert REASON == "Peer cw-h100 lost for 15 min; the job's state there is unknown"
    assert loss_reason("cw-h100", configured=True, peer_lost_ms=90_000) == (
        "Peer cw-h100 lost for 90 s; the job's state there is unknown"
    )
    assert loss_reason("cw-h100", configured=False, peer_lost_ms=LOST_MS) == reasons.peer_removed("cw-h100")


def test_a_job_never_reported_running_goes_back_to_the_queue_whatever_its_policy() -> None:
    for state in (JobState.PENDING, JobState.ACCEPTED):
        for policy in OnPeerLost:
            assert decide(state=state, policy=policy) == LostRequeue(REASON)


def test_a_job_reported_running_follows_its_policy() -> None:
    assert decide(state=JobState.RUNNING) == LostEnd(JobState.FAILED, REASON)
    assert decide(state=JobState.RUNNING, policy=OnPeerLost.REQUEUE) == LostRequeue(REASON)
    # It ran once, and its peer reports it pending again (a restarted pod): it still counts as running.
    assert decide(state=JobState.PENDING, started=True) == LostEnd(JobState.FAILED, REASON)


def test_a_pinned_job_fails_with_the_reason() -> None:
    assert decide(pinned=True, policy=OnPeerLost.REQUEUE) == LostEnd(JobState.FAILED, REASON)


def test_a_cancel_the_peer_never_confirmed_ends_the_job_killed() -> None:
    assert decide(cancel=True, pinned=True, state=JobState.RUNNING) == LostEnd(
        JobState.KILLED, f"Cancelled without the peer's confirmation: {REASON}"
    )


@given(
    st.sampled_from([JobState.PENDING, JobState.ACCEPTED, JobState.RUNNING]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(list(OnPeerLost)),
)
def test_a_job_that_ran_moves_only_when_it_asked_to_and_a_pinned_one_never(
    state: JobState, started: bool, pinned: bool, cancel: bool, policy: OnPeerLost
) -> None:
    decision = decide(state=state, started=started, pinned=pinned, cancel=cancel, policy=policy)
    ran = started or state is JobState.RUNNING
    if isinstance(decision, LostRequeue):
        assert not pinned and not cancel and (not ran or policy is OnPeerLost.REQUEUE)
    else:
        assert isinstance(decision, LostEnd) and REASON in decision.error

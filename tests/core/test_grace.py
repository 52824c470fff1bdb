"""Grace periods and cooldowns: when an unreported job is gone, when leftovers on a removed peer are
forgotten, when a stale peer may be probed again at submit."""

from __future__ import annotations

from iris_airflow_provider.core.grace import (
    ABANDONED_UNCONFIGURED_TTL_MS,
    LOCAL_START_GRACE_MS,
    STALE_PROBE_COOLDOWN_MS,
    abandoned_on_unconfigured_peer_expired,
    may_probe_stale_peer,
    unreported_job_is_gone,
)
from iris_airflow_provider.core.states import Direction

NOW = 10_000_000_000


def test_a_local_job_never_reported_is_gone_only_after_the_start_grace() -> None:
    young = NOW - LOCAL_START_GRACE_MS + 1
    assert not unreported_job_is_gone(Direction.LOCAL, ever_reported=False, submitted_at_ms=young, now_ms=NOW)
    old = NOW - LOCAL_START_GRACE_MS
    assert unreported_job_is_gone(Direction.LOCAL, ever_reported=False, submitted_at_ms=old, now_ms=NOW)


def test_a_job_once_reported_and_now_unknown_is_gone_at_once() -> None:
    for direction in (Direction.LOCAL, Direction.RECEIVED):
        assert unreported_job_is_gone(direction, ever_reported=True, submitted_at_ms=NOW, now_ms=NOW)


def test_a_received_job_never_reported_waits_for_its_runner_however_long() -> None:
    assert not unreported_job_is_gone(Direction.RECEIVED, ever_reported=False, submitted_at_ms=0, now_ms=NOW)


def test_leftovers_on_a_removed_peer_are_forgotten_after_the_ttl() -> None:
    assert not abandoned_on_unconfigured_peer_expired(NOW - ABANDONED_UNCONFIGURED_TTL_MS, NOW)
    assert abandoned_on_unconfigured_peer_expired(NOW - ABANDONED_UNCONFIGURED_TTL_MS - 1, NOW)


def test_a_stale_peer_is_probed_unless_asked_within_the_cooldown() -> None:
    assert not may_probe_stale_peer(fresh=True, last_attempt_ms=None, now_ms=NOW)
    assert may_probe_stale_peer(fresh=False, last_attempt_ms=None, now_ms=NOW)
    assert not may_probe_stale_peer(fresh=False, last_attempt_ms=NOW - STALE_PROBE_COOLDOWN_MS + 1, now_ms=NOW)
    assert may_probe_stale_peer(fresh=False, last_attempt_ms=NOW - STALE_PROBE_COOLDOWN_MS, now_ms=NOW)

"""How long the services wait before they conclude: grace periods and cooldowns, as pure rules.

- A local job is admitted to the store before its backend has it: a job its backend has never
  reported is only gone once its submitter has had ``LOCAL_START_GRACE_MS`` to hand it over. A job
  received from a peer is started by its runner task, whenever Airflow runs it: never gone unseen.
- What a requeue left on a peer that is no longer configured cannot be stopped there: it is
  forgotten after ``ABANDONED_UNCONFIGURED_TTL_MS``.
- At submit, a peer without a fresh heartbeat is asked again at most every
  ``STALE_PROBE_COOLDOWN_MS``: a dead peer then slows one submit in a while, not every one.
"""

from __future__ import annotations

from iris_airflow_provider.core.states import Direction

LOCAL_START_GRACE_MS = 60_000
ABANDONED_UNCONFIGURED_TTL_MS = 7 * 24 * 3600 * 1000
STALE_PROBE_COOLDOWN_MS = 30_000


def unreported_job_is_gone(direction: Direction, *, ever_reported: bool, submitted_at_ms: int, now_ms: int) -> bool:
    """Whether a job this cluster runs, which its backend does not know, has gone (rather than not
    arrived yet)."""
    if ever_reported:
        return True
    if direction is Direction.RECEIVED:
        return False
    return now_ms - submitted_at_ms >= LOCAL_START_GRACE_MS


def abandoned_on_unconfigured_peer_expired(abandoned_at_ms: int, now_ms: int) -> bool:
    """Whether to stop waiting to stop a leftover incarnation on a peer removed from the configuration."""
    return now_ms - abandoned_at_ms > ABANDONED_UNCONFIGURED_TTL_MS


def may_probe_stale_peer(*, fresh: bool, last_attempt_ms: int | None, now_ms: int) -> bool:
    """Whether a peer should be asked for a heartbeat at submit: it has none fresh, and was not asked lately."""
    if fresh:
        return False
    return last_attempt_ms is None or now_ms - last_attempt_ms >= STALE_PROBE_COOLDOWN_MS

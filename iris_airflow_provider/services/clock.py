"""The wall clock the services read by default (tests pass their own clock)."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000

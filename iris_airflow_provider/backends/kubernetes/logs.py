"""Reading a Kubernetes job's output from its pods, with a cursor that makes re-reads exact.

The pod log API has no offsets, only ``since_seconds`` and timestamps. The cursor keeps, per pod,
the last timestamp seen and how many lines carried it; each read asks for a little more than
since then (``LOG_SKEW_MARGIN_S``, for clock skew) and drops what the cursor has already seen.

Pure: the caller reads the logs (see ``api.py``) and hands the text in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from iris_airflow_provider.backends.base import LogChunk, decode_cursor, replica_line
from iris_airflow_provider.backends.kubernetes.results import is_result_line
from iris_airflow_provider.backends.kubernetes.status import ms, pod_index

LOG_SKEW_MARGIN_S = 300  # reading logs "since" the last line seen: tolerate this much clock skew
_Count = Annotated[int, Field(ge=0, le=2**63 - 1, strict=True)]
# Per pod name: [the last timestamp seen (ns), how many lines carried it].
CURSOR = TypeAdapter(dict[str, Annotated[list[_Count], Field(min_length=2, max_length=2)]])


def parse_timestamp(raw: str) -> int | None:
    """RFC 3339 with up to nanoseconds (as the kubelet writes them) -> nanoseconds since the epoch."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", raw)
    if match is None:
        return None
    zone = "+00:00" if match[3] == "Z" else match[3]
    seconds = int(datetime.fromisoformat(match[1] + zone).timestamp())
    return seconds * 1_000_000_000 + int((match[2] or "0").ljust(9, "0"))


class LogReader:
    """New lines of a job's pods since the cursor: per pod, the last timestamp seen and how many
    lines carried it (the API has no offsets; timestamps with a count make re-reads exact)."""

    def __init__(self, cursor: str, max_lines: int, now_ms: int) -> None:
        self.positions: dict[str, list[int]] = decode_cursor(cursor, CURSOR, {})
        self.max_lines = max_lines
        self.now_ms = now_ms
        self.lines: list[str] = []
        self.truncated = False

    def plan(self, pods: Sequence[Any]) -> list[tuple[Any, int | None]]:
        """The pods to read, in replica order, each with a ``since_seconds`` bound (None: all)."""
        ordered = sorted(pods, key=lambda p: (pod_index(p), ms(p.metadata.creation_timestamp) or 0))
        plan = []
        for pod in ordered:
            if (pod.status.phase if pod.status else None) not in ("Running", "Succeeded", "Failed"):
                continue
            position = self.positions.get(pod.metadata.name)
            since = None
            if position:
                since = max(1, (self.now_ms * 1_000_000 - position[0]) // 1_000_000_000 + LOG_SKEW_MARGIN_S)
            plan.append((pod, since))
        return plan

    def take(self, pod: Any, data: bytes | str) -> bool:
        """Add the pod's new lines; False once ``max_lines`` is reached."""
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        name = pod.metadata.name
        last, seen_at_last = self.positions.get(name, [0, 0])
        index = pod_index(pod)
        same = 0  # lines carrying the current timestamp so far in this read
        current = None
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")
            when = parse_timestamp(stamp)
            if when is None:
                continue
            same = same + 1 if when == current else 1
            current = when
            if when < last or (when == last and same <= seen_at_last):
                continue
            if is_result_line(line):  # the job's result, handed back apart (results.py)
                last, seen_at_last = when, same
                self.positions[name] = [last, seen_at_last]
                continue
            if len(self.lines) >= self.max_lines:
                self.truncated = True
                return False
            self.lines.append(replica_line(index, line))
            last, seen_at_last = when, same
            self.positions[name] = [last, seen_at_last]
        return True

    def chunk(self) -> LogChunk:
        return LogChunk(tuple(self.lines), json.dumps(self.positions, sort_keys=True), self.truncated)

"""Reading a process-backend job's output: ``replica-<i>.log`` files, by byte offsets.

The cursor is a JSON object of byte offsets per replica index. A partial last line is held back
while the job may still write the rest of it, and returned whole once the job has ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter

from iris_airflow_provider.backends.base import LogChunk, decode_cursor, replica_line

# Byte offset per replica index ("0", "1", ...).
CURSOR = TypeAdapter(dict[str, Annotated[int, Field(ge=0, le=2**62, strict=True)]])


def read_logs(directory: Path, replicas: int, *, finished: bool, cursor: str = "", max_lines: int = 1000) -> LogChunk:
    """New lines of the job in ``directory`` since ``cursor``, replica by replica, at most ``max_lines``.

    ``finished``: nothing more will be written, so a last line without a newline is whole.
    """
    offsets: dict[str, int] = decode_cursor(cursor, CURSOR, {})
    lines: list[str] = []
    truncated = False
    for index in range(replicas):
        path = directory / f"replica-{index}.log"
        if not path.exists():
            continue
        with path.open("rb") as handle:
            handle.seek(offsets.get(str(index), 0))
            while True:
                position = handle.tell()
                raw = handle.readline()
                # Nothing more, or a partial line: read it whole next time (unless the job has ended).
                if not raw or (not raw.endswith(b"\n") and not finished):
                    handle.seek(position)
                    break
                if len(lines) >= max_lines:
                    truncated = True
                    handle.seek(position)
                    break
                lines.append(replica_line(index, raw.decode(errors="replace").rstrip()))
            offsets[str(index)] = handle.tell()
    return LogChunk(tuple(lines), json.dumps(offsets, sort_keys=True), truncated)

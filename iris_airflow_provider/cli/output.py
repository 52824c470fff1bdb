"""How the CLI prints: JSON documents, padded tables, ages, bands and capacity in a few characters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO


def emit(stdout: TextIO, document: Any, *, indent: int | None = 2) -> None:
    json.dump(document, stdout, indent=indent)
    stdout.write("\n")


def table(stdout: TextIO, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; the last column is never padded."""
    cells = [[str(h) for h in headers], *[["-" if c in (None, "") else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        stdout.write(
            "  ".join(c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)).rstrip() + "\n"
        )


def age(ms: int | None) -> str:
    if ms is None:
        return "never"
    seconds = max(0, ms // 1000)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 172_800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def band(wire: str) -> str:
    return wire.removeprefix("PRIORITY_BAND_").lower()


def capacity(backend: dict[str, Any]) -> str:
    if backend.get("error"):
        return f"error: {backend['error']}"
    block = backend.get("availability")
    if block is None:
        return "not reported (shape only)"
    parts = []
    for variant in sorted(set(block.get("total_amounts") or {}) | set(block.get("amounts") or {})):
        free, total = (block.get("amounts") or {}).get(variant, 0), (block.get("total_amounts") or {}).get(variant, 0)
        held = [
            f"{band(entry['band'])} {entry['amounts'][variant]}"
            for entry in block.get("held_by_band") or []
            if entry.get("amounts", {}).get(variant)
        ]
        parts.append(f"{variant} {free}/{total} free" + (f" (held: {', '.join(held)})" if held else ""))
    if backend.get("reserved_note"):
        parts.append(backend["reserved_note"])
    if backend.get("held_for"):
        parts.append(backend["held_for"]["text"])
    return "; ".join(parts) or "no device capacity"


def attributes(backend: dict[str, Any]) -> str:
    return " ".join(f"{k}={','.join(map(str, v['values']))}" for k, v in backend["advertised_attributes"].items())

"""How the CLI prints: a command's report in Airflow's ``--output`` formats, and the few-character
forms of ages, bands and capacity its tables use.

``json`` and ``yaml`` print the command's whole document (the UI API's shapes: numbers stay numbers);
``table`` and ``plain`` print its rows through Airflow's own console, as ``airflow connections list``
does. Airflow is imported only when a report is printed, so ``iris-federation simulate`` and
``keygen`` run where Airflow is not configured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

OUTPUT_FORMATS = ("table", "json", "yaml", "plain")


@dataclass(frozen=True)
class Table:
    """Rows of one table (each a dict: its keys are the columns), with an optional line above it."""

    rows: Sequence[dict[str, Any]]
    title: str | None = None


@dataclass(frozen=True)
class Report:
    """What a command prints: ``document`` for json and yaml; ``parts`` (tables and lines) otherwise."""

    document: Any
    parts: Sequence[Table | str] = field(default_factory=list)
    exit_code: int = 0


def render(report: Report, output: str) -> None:
    """Print ``report`` to standard output in ``output`` (one of ``OUTPUT_FORMATS``)."""
    from airflow.cli.simple_table import AirflowConsole
    from rich.markup import escape

    if output not in OUTPUT_FORMATS:
        raise ValueError(f"--output must be one of {', '.join(OUTPUT_FORMATS)}, got {output!r}")
    console = AirflowConsole()
    if output == "json":
        console.print_as_json(report.document)
        return
    if output == "yaml":
        console.print_as_yaml(report.document)
        return
    for part in report.parts:
        if isinstance(part, str):
            console.print(part, markup=False, highlight=False)
            continue
        if part.title:
            console.print(part.title, markup=False, highlight=False)
        if output == "plain":
            console.print_as_plain_table([{k: _cell(v) for k, v in row.items()} for row in part.rows])
        else:
            # Cells are data: a job's reason such as "[iris-federation] ..." is not rich markup.
            console.print_as_table([{k: escape(_cell(v)) for k, v in row.items()} for row in part.rows])


def _cell(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


def emit(stdout: TextIO, document: Any, *, indent: int | None = 2) -> None:
    json.dump(document, stdout, indent=indent)
    stdout.write("\n")


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

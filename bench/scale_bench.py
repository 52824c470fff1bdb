"""The placement pass at internet scale, on paper: time and memory at 1,000 peers x 10 backends.

Generates the GPU mix of ``bench/placement_bench.py`` (scarce capacity, four variants, four bands,
regions, pinned jobs, a ledger, a few jobs past their deadline) at ``--sizes`` queued jobs x
``--peers`` peers x ``--backends`` backends per peer, then measures the pure pass
(``core.placement.plan``, as ``placement_bench`` calls it, cap ``--cap`` per peer):

- **time**: best of ``--repeat`` runs, garbage collector off (as ``timeit``; ``placement_bench``
  explains why), and how long generating the input took;
- **memory**: the input's size (resident memory before and after generating it, and what
  ``tracemalloc`` counts as allocated for it), the pass's own peak allocation on top of its input
  (``tracemalloc``, in a separate run: tracing slows the pass down), and the process's peak
  resident memory (``resource.getrusage``).

Run from the repository root::

    nice .venv/bin/python -m bench.scale_bench                    # 100k and 1m jobs (a few minutes, about 5 GiB)
    nice .venv/bin/python -m bench.scale_bench --sizes 1m --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/scale_bench.py``: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.placement_bench import NOW_MS, STALENESS_MS, Case, _best_of, environment, generate
from iris_airflow_provider.core.placement import plan

SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
MIB = 1024 * 1024


def resident_bytes() -> int:
    """The process's resident memory now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def measure(case: Case, *, cap: int | None, seed: int, repeat: int) -> dict[str, Any]:
    gc.collect()
    rss_before = resident_bytes()
    tracemalloc.start()
    started = time.perf_counter()
    state = generate(case, seed, "gpu")
    generate_seconds = time.perf_counter() - started
    input_traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    rss_input = resident_bytes() - rss_before
    max_per_peer = case.jobs if cap is None else cap
    jobs, peers, ledger = state.candidates, state.peers, state.ledger

    def run() -> Any:
        return plan(
            jobs,
            peers,
            ledger,
            now_ms=NOW_MS,
            max_per_peer=max_per_peer,
            staleness_ms=STALENESS_MS,
        )

    seconds, result = _best_of(repeat, run, collect=False)
    del result
    gc.collect()
    tracemalloc.start()
    traced = run()
    _, pass_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "case": case.name,
        "jobs": case.jobs,
        "peers": case.peers,
        "backends_per_peer": case.backends,
        "max_per_peer": cap,
        "pass_seconds": round(seconds, 3),
        "pass_runs": repeat,
        "microseconds_per_job": round(1e6 * seconds / case.jobs, 2),
        "generate_seconds": round(generate_seconds, 1),
        "input_resident_mib": round(rss_input / MIB),
        "input_traced_mib": round(input_traced / MIB),
        "input_bytes_per_job": round(input_traced / case.jobs),
        "pass_peak_traced_mib": round(pass_peak / MIB),
        "pass_peak_bytes_per_job": round(pass_peak / case.jobs),
        "promoted": len(traced.promotions),
        "pending": len(traced.pending),
        "expired": len(traced.expired),
        "process_peak_resident_mib": round(peak_resident_bytes() / MIB),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100k,1m", help=f"comma-separated, of {', '.join(SIZES)} (default 100k,1m)")
    parser.add_argument("--peers", type=int, default=1000, help="peers (default 1000)")
    parser.add_argument("--backends", type=int, default=10, help="backends per peer (default 10)")
    parser.add_argument("--cap", default="8", help="max promotions per peer per pass: a number or none (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of the pass, best kept (default 3)")
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in sizes if size not in SIZES]
    if unknown or not sizes:
        parser.error(f"--sizes: unknown {', '.join(unknown) or '(none)'}; accepted: {', '.join(SIZES)}")
    if args.cap == "none":
        cap: int | None = None
    elif args.cap.isdigit() and int(args.cap) > 0:
        cap = int(args.cap)
    else:
        parser.error(f"--cap: a positive whole number or none, got {args.cap!r}")
    for name in ("peers", "backends", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    env = environment()
    rows = []
    for size in sizes:
        case = Case(size, SIZES[size], args.peers, args.backends)
        if not args.json:
            print(f"running {case.jobs:,} jobs x {case.peers:,} peers x {case.backends} backends ...", file=sys.stderr)
        rows.append(measure(case, cap=cap, seed=args.seed, repeat=args.repeat))
    env["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps({"environment": env, "rows": rows}, indent=2))
        return 0
    print(
        f"Python {env['python']}, {env['usable_cpus']} usable CPUs, load average {env['load_average_1m']} before, "
        f"{env['load_average_1m_after']} after; cap {args.cap} per peer"
    )
    columns = [
        ("jobs", "jobs"),
        ("pass s", "pass_seconds"),
        ("us/job", "microseconds_per_job"),
        ("generate s", "generate_seconds"),
        ("input RSS MiB", "input_resident_mib"),
        ("input traced MiB", "input_traced_mib"),
        ("B/job input", "input_bytes_per_job"),
        ("pass peak MiB", "pass_peak_traced_mib"),
        ("B/job pass", "pass_peak_bytes_per_job"),
        ("peak RSS MiB", "process_peak_resident_mib"),
        ("promoted", "promoted"),
        ("pending", "pending"),
        ("expired", "expired"),
    ]
    print(" | ".join(title for title, _ in columns))
    for row in rows:
        print(" | ".join(f"{row[key]:,}" if isinstance(row[key], int) else str(row[key]) for _, key in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())

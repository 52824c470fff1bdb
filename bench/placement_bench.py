"""Benchmark of the placement pass: the indexed pass against the plain reference scan, same input.

For each case (queued jobs x peers x backends per peer) it generates one federation state from a
seed, then times ``placement.plan`` (best of ``--repeat`` runs) and the test suite's
``reference_plan`` (fewer runs, once at 100k: it is slow), and checks they decide identically.
Only the pass is timed, never input generation or the comparison, and with the garbage collector
off as ``timeit`` does (``--gc`` keeps it on). Each case runs once per ``--caps`` value
(``max_per_peer``, default 8) and ``--mixes`` value: ``gpu``, the benchmark's main input (GPU jobs
against scarce GPU capacity: capacity binds, so the reference scans every backend for most jobs),
and ``everything``, which adds CPU, TPU and ``auto`` jobs that fit anywhere: every peer reaches its
cap within the first few thousand jobs, after which both passes skip it (see README.md).

The state is contended on purpose: scarce GPU capacity (most backends nearly full, some capacity
only reachable by reclaiming from lower bands), four GPU variants, all four bands, ungated CPU,
TPU and ``auto`` jobs, pinned jobs (a few to a peer that does not exist), region constraints,
shape-only backends (no availability block, or one of a version we do not understand), a ledger
with rows that apply, rows for older observations and rows for backends that are gone, and a few
jobs past their deadline.

Run from the repository root::

    .venv/bin/python -m bench.placement_bench
    .venv/bin/python -m bench.placement_bench --sizes 1k,10k --caps 8 --json
    .venv/bin/python -m bench.placement_bench --skip-reference
    python bench/placement_bench.py --help
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/placement_bench.py``: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import capacity_scenarios
from iris_airflow_provider.core.availability import Availability, PeerBackend, PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import Constraint, Op, normalize_advertised
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import DEFAULT_MAX_HANDOFFS_PER_CYCLE, Candidate, plan
from tests.core.reference_placement import as_reference_shape, reference_plan

NOW_MS = 10_000_000_000
STALENESS_MS = 120_000

GPU_VARIANTS = ("h100", "a100", "gb200", "h200")
TPU_VARIANTS = ("v5p-8", "v6e-8")
REGIONS = ("us-east", "us-west", "eu-west")
BANDS = tuple(Band)

MIXES = ("gpu", "everything")
GOAL_CASE = "100k"
GOAL_MIX = "gpu"  # the input: scarce capacity, mixed variants and bands
GOAL_SECONDS = 1.0
GOAL_RATIO = 20.0


@dataclass(frozen=True)
class Case:
    name: str
    jobs: int
    peers: int
    backends: int  # per peer


CASES = {
    case.name: case for case in (Case("1k", 1_000, 10, 4), Case("10k", 10_000, 50, 4), Case("100k", 100_000, 50, 4))
}


@dataclass(frozen=True)
class State:
    candidates: list[Candidate]
    peers: list[PeerState]
    ledger: list[LedgerEntry]


def _weighted(rng: random.Random, table: Sequence[tuple[Any, int]]) -> Any:
    return rng.choices([value for value, _ in table], weights=[weight for _, weight in table])[0]


def _gpu_backend(rng: random.Random, backend_id: str, region: str | None, mix: str) -> PeerBackend:
    variants = [_weighted(rng, [("h100", 4), ("a100", 3), ("h200", 2), ("gb200", 1)])]
    if rng.random() < 0.15:  # a few backends serve two variants
        variants.append(rng.choice([v for v in GPU_VARIANTS if v != variants[0]]))
    attributes: dict[str, list[str]] = {"device-type": ["gpu"], "device-variant": variants}
    if region is not None:
        attributes["region"] = [region]
    availability = None
    # none / v3: matched on shape only. In the GPU mix they are rare: a shape-only backend takes every job
    # that matches it, so its peer reaches the per-tick cap at once and stops being a candidate.
    shape_only = 1 if mix == "gpu" else 3
    metric = _weighted(rng, [("v2", 40 if mix == "gpu" else 16), ("v1", 1), ("none", shape_only), ("v3", shape_only)])
    if metric != "none":
        # Scarce: mostly full or nearly so; more is often held by lower bands than is idle.
        # The GPU mix is scarcer still: the queue is long because capacity, not the per-tick cap, binds.
        idle = (0,) * 12 + (1, 2, 4, 8) if mix == "gpu" else (0, 0, 0, 0, 1, 2, 4, 8)
        amounts = {v: rng.choice(idle) for v in variants}
        held = {
            band: {v: rng.choice((0, 2, 4, 8, 16)) for v in variants}
            for band in rng.sample(BANDS[1:] if mix == "gpu" else BANDS, rng.randint(0, 2 if mix == "gpu" else 4))
        }
        version = {"v1": 1, "v2": 2, "v3": 3}[metric]
        epoch = NOW_MS - rng.randrange(1_000, 60_000)
        total = dict.fromkeys(variants, 64)
        availability = Availability(version, epoch, amounts, total, held)
    return PeerBackend(backend_id, normalize_advertised(attributes), availability, kind="kubernetes")


def _ungated_backend(rng: random.Random, backend_id: str, region: str | None, device: str) -> PeerBackend:
    attributes: dict[str, list[str]] = {"device-type": [device]}
    if device == "tpu":
        attributes["device-variant"] = [rng.choice(TPU_VARIANTS)]
    if region is not None:
        attributes["region"] = [region]
    availability = None
    if rng.random() < 0.7:  # tracked, but no GPU token to spend
        availability = Availability(2, NOW_MS - rng.randrange(1_000, 60_000), {}, {}, {})
    return PeerBackend(backend_id, normalize_advertised(attributes), availability, kind="process")


def _peer(rng: random.Random, peer_id: str, backends: int, mix: str) -> PeerState:
    home = rng.choice(REGIONS)
    members = []
    for index in range(backends):
        region = home if rng.random() < 0.8 else None  # some backends do not advertise a region
        device = "gpu" if mix == "gpu" else _weighted(rng, [("gpu", 6), ("tpu", 1), ("cpu", 1)])
        backend_id = f"{device}-{index}"
        if device == "gpu":
            members.append(_gpu_backend(rng, backend_id, region, mix))
        else:
            members.append(_ungated_backend(rng, backend_id, region, device))
    return PeerState(peer_id, True, NOW_MS - rng.randrange(0, 60_000), tuple(members))


def _candidate(rng: random.Random, index: int, peer_ids: Sequence[str], mix: str) -> Candidate:
    # New Constraint objects for every job, as parsing each job spec would produce.
    shape: list[Constraint] = []
    gate: tuple[tuple[str, int], ...] = ()
    device = "gpu" if mix == "gpu" else _weighted(rng, [("gpu", 70), ("gpu-auto", 8), ("tpu", 10), ("cpu", 12)])
    if device == "gpu":
        variant = _weighted(rng, [("h100", 40), ("a100", 25), ("h200", 20), ("gb200", 15)])
        shape += [Constraint("device-type", Op.EQ, ("gpu",)), Constraint("device-variant", Op.EQ, (variant,))]
        gate = ((variant, rng.choice((1, 2, 4, 8)) * rng.choice((1, 1, 1, 2, 4))),)
    elif device == "gpu-auto":
        shape.append(Constraint("device-type", Op.EQ, ("gpu",)))
    elif device == "tpu":
        shape += [
            Constraint("device-type", Op.EQ, ("tpu",)),
            Constraint("device-variant", Op.EQ, (rng.choice(TPU_VARIANTS),)),
        ]
    roll = rng.random()
    if roll < 0.10:
        shape.append(Constraint("region", Op.EQ, (rng.choice(REGIONS),)))
    elif roll < 0.15:
        shape.append(Constraint("region", Op.IN, tuple(sorted(rng.sample(REGIONS, 2)))))
    pin = ""
    if rng.random() < 0.05:
        pin = rng.choice(peer_ids) if rng.random() < 0.95 else "ghost-peer"
    deadline = None
    if rng.random() < 0.03:
        deadline = NOW_MS + rng.choice((-60_000, -1, 0, 60_000))
    return Candidate(
        job_id=f"/bench/job-{index:06d}",
        band=_weighted(rng, [(Band.PRODUCTION, 10), (Band.PRIORITY, 20), (Band.INTERACTIVE, 40), (Band.BATCH, 30)]),
        submitted_at_ms=NOW_MS - rng.randrange(0, 3_600_000),
        pinned_peer_id=pin,
        shape=tuple(shape),
        gate=gate,
        deadline_ms=deadline,
    )


def _ledger(rng: random.Random, peers: Sequence[PeerState]) -> list[LedgerEntry]:
    rows = []
    for peer in peers:
        for backend in peer.backends:
            availability = backend.availability
            if availability is None or not availability.amounts or rng.random() >= 0.3:
                continue
            # Mostly rows for the current observation; some for an older one (dropped) or a newer one.
            epoch = availability.observation_epoch_ms + rng.choice((0, 0, 0, -1, 1))
            token = rng.choice(list(availability.amounts))
            rows.append(LedgerEntry(peer.peer_id, backend.backend_id, epoch, {token: rng.choice((1, 2, 4))}))
    rows += [LedgerEntry("gone-peer", "gpu-0", NOW_MS - 5_000, {"h100": 8}) for _ in range(3)]
    return rows


def generate(case: Case, seed: int, mix: str = "gpu") -> State:
    """One deterministic state per (case, seed, mix)."""
    rng = random.Random(seed)
    peers = [_peer(rng, f"peer-{index:03d}", case.backends, mix) for index in range(case.peers)]
    peer_ids = [peer.peer_id for peer in peers]
    candidates = [_candidate(rng, index, peer_ids, mix) for index in range(case.jobs)]
    rng.shuffle(candidates)  # arrival order is not queue order
    return State(candidates, peers, _ledger(rng, peers))


def _best_of(runs: int, call: Callable[[], Any], *, collect: bool) -> tuple[float, Any]:
    """Best wall time of ``runs`` calls, and the last result.

    Like ``timeit``, the garbage collector is off while the pass runs unless ``collect``: whether a
    full collection lands inside a pass depends on the heap around it (here, the generated input)
    more than on the pass, and on the 100k input one costs about half as much as the pass itself.
    """
    best = float("inf")
    result = None
    for _ in range(runs):
        result = None
        gc.collect()
        if not collect:
            gc.disable()
        try:
            start = time.perf_counter()
            result = call()
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed)
    return best, result


@dataclass
class Row:
    case: str
    mix: str
    jobs: int
    peers: int
    backends_per_peer: int
    max_per_peer: int | None  # None: no cap (max_per_peer = number of jobs, so it never binds)
    real_seconds: float
    real_runs: int
    reference_seconds: float | None
    reference_runs: int
    ratio: float | None
    identical: bool | None
    promoted: int
    preempting: int
    capped_peers: int
    pending: int
    expired: int


def run_case(
    case: Case,
    cap: int | None,
    mix: str,
    *,
    seed: int,
    repeat: int,
    reference_repeat: int,
    skip_reference: bool,
    collect: bool,
) -> Row:
    state = generate(case, seed, mix)
    max_per_peer = case.jobs if cap is None else cap

    jobs, peers, ledger = state.candidates, state.peers, state.ledger

    def real() -> Any:
        return plan(jobs, peers, ledger, now_ms=NOW_MS, max_per_peer=max_per_peer, staleness_ms=STALENESS_MS)

    def reference() -> Any:
        return reference_plan(jobs, peers, ledger, now_ms=NOW_MS, max_per_peer=max_per_peer, staleness_ms=STALENESS_MS)

    real_seconds, result = _best_of(repeat, real, collect=collect)
    reference_seconds = ratio = identical = None
    reference_runs = 0
    if not skip_reference:
        reference_runs = 1 if case.name == GOAL_CASE else reference_repeat
        reference_seconds, expected = _best_of(reference_runs, reference, collect=collect)
        ratio = reference_seconds / real_seconds
        identical = as_reference_shape(result) == expected
    return Row(
        case=case.name,
        mix=mix,
        jobs=case.jobs,
        peers=case.peers,
        backends_per_peer=case.backends,
        max_per_peer=cap,
        real_seconds=real_seconds,
        real_runs=repeat,
        reference_seconds=reference_seconds,
        reference_runs=reference_runs,
        ratio=ratio,
        identical=identical,
        promoted=len(result.promotions),
        preempting=sum(p.preempts for p in result.promotions),
        capped_peers=sum(1 for n in result.promoted_per_peer.values() if n >= max_per_peer),
        pending=len(result.pending),
        expired=len(result.expired),
    )


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def _cap_name(cap: int | None) -> str:
    return "none" if cap is None else str(cap)


def goals(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The goal at 100k, per cap: the real pass under 1 s, 20x the reference, identical decisions."""
    out = []
    for row in rows:
        if row.case != GOAL_CASE or row.mix != GOAL_MIX:
            continue
        under = row.real_seconds < GOAL_SECONDS
        faster = None if row.ratio is None else row.ratio >= GOAL_RATIO
        out.append(
            {
                "case": row.case,
                "mix": row.mix,
                "max_per_peer": row.max_per_peer,
                "real_under_seconds": GOAL_SECONDS,
                "real_met": under,
                "min_ratio": GOAL_RATIO,
                "ratio_met": faster,
                "identical": row.identical,
                "met": under and bool(faster) and bool(row.identical),
            }
        )
    return out


def _seconds(value: float | None, runs: int) -> str:
    if value is None:
        return "skipped"
    return f"{value:8.4f} s ({'best of ' + str(runs) if runs > 1 else 'one run'})"


def print_table(rows: Sequence[Row], env: dict[str, Any], config: dict[str, Any]) -> None:
    print(
        f"python {env['python']} ({env['implementation']}) on {env['platform']}; "
        f"{env['cpu_count']} CPUs ({env['usable_cpus']} usable), load average {env['load_average_1m']} at start"
    )
    gc_text = "collector on" if config["gc_enabled_while_timing"] else "collector off while timing, as timeit"
    print(
        f"seed {config['seed']}; wall time of the pass only ({gc_text}); the real pass is the best of "
        f"{config['repeat']} runs, the reference the best of {config['reference_repeat']}, but one run at {GOAL_CASE}"
    )
    print("cap: max_per_peer; 'none' sets it to the number of jobs, so it never binds")
    print(
        "mix gpu: GPU jobs of four variants and four bands against scarce GPU capacity (capacity binds); "
        "mix everything: a third of the jobs are CPU, TPU or auto, which fit anywhere, so every peer "
        "reaches its cap within the first jobs and both passes stop looking at it"
    )
    print()
    header = (
        f"{'case':>5} {'mix':>10} {'cap':>4} {'jobs x peers x backends':>23}  {'real (placement.plan)':>26}  "
        f"{'reference (reference_plan)':>26}  {'ratio':>7}  {'identical':>9}  "
        f"{'promoted':>8} {'preempt':>7} {'capped':>6} {'pending':>7} {'expired':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:6.1f}x"
        identical = "-" if row.identical is None else ("yes" if row.identical else "NO")
        size = f"{row.jobs} x {row.peers} x {row.backends_per_peer}"
        print(
            f"{row.case:>5} {row.mix:>10} {_cap_name(row.max_per_peer):>4} {size:>23}  "
            f"{_seconds(row.real_seconds, row.real_runs):>26}  "
            f"{_seconds(row.reference_seconds, row.reference_runs):>26}  "
            f"{ratio:>7}  {identical:>9}  {row.promoted:>8} {row.preempting:>7} {row.capped_peers:>6} "
            f"{row.pending:>7} {row.expired:>7}"
        )
    verdicts = goals(rows)
    if verdicts:
        print()
    for verdict in verdicts:
        ratio_text = {None: "not measured", True: "met", False: "MISSED"}[verdict["ratio_met"]]
        identical_text = {None: "not checked", True: "yes", False: "NO"}[verdict["identical"]]
        print(
            f"goal at {GOAL_CASE}, mix {verdict['mix']}, cap {_cap_name(verdict['max_per_peer'])}: "
            f"real pass under {GOAL_SECONDS:g} s: {'met' if verdict['real_met'] else 'MISSED'}; "
            f"at least {GOAL_RATIO:g}x the reference: {ratio_text}; identical decisions: {identical_text}"
        )


def _parse_caps(raw: str) -> list[int | None]:
    caps: list[int | None] = []
    for item in raw.split(","):
        item = item.strip().lower()
        if item == "none":
            caps.append(None)
        elif item.isdigit() and int(item) >= 1:
            caps.append(int(item))
        elif item:
            raise ValueError(item)
    return caps


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.placement_bench",
        description="Time placement.plan against the reference scan on generated federation states.",
    )
    parser.add_argument(
        "--sizes", default=",".join(CASES), help=f"comma-separated cases among {', '.join(CASES)} (default: all)"
    )
    parser.add_argument(
        "--caps",
        default=f"{DEFAULT_MAX_HANDOFFS_PER_CYCLE},none",
        help="comma-separated max_per_peer values; 'none': the cap never binds (default: %(default)s)",
    )
    parser.add_argument(
        "--mixes", default=",".join(MIXES), help=f"comma-separated job mixes among {', '.join(MIXES)} (default: all)"
    )
    parser.add_argument("--skip-reference", action="store_true", help="time the real pass only (quick)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table")
    parser.add_argument("--seed", type=int, default=20240601, help="seed for input generation (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the real pass; the best counts (default: 5)")
    parser.add_argument(
        "--reference-repeat",
        type=int,
        default=3,
        help=f"runs of the reference below {GOAL_CASE}, which runs once at {GOAL_CASE} (default: 3)",
    )
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector on while timing")
    capacity_scenarios.add_arguments(parser)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.sizes.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown or not names:
        parser.error(f"--sizes: unknown case(s) {', '.join(unknown) or '(none given)'}; accepted: {', '.join(CASES)}")
    try:
        args.cap_values = _parse_caps(args.caps)
    except ValueError as error:
        parser.error(f"--caps: {error} is neither a positive integer nor 'none'")
    if not args.cap_values:
        parser.error("--caps: give at least one value")
    if args.repeat < 1 or args.reference_repeat < 1:
        parser.error("--repeat and --reference-repeat must be >= 1")
    args.cases = [CASES[name] for name in names]
    args.mix_values = [mix.strip() for mix in args.mixes.split(",") if mix.strip()]
    if not args.mix_values or any(mix not in MIXES for mix in args.mix_values):
        parser.error(f"--mixes: accepted: {', '.join(MIXES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment()
    config = {
        "seed": args.seed,
        "caps": [_cap_name(cap) for cap in args.cap_values],
        "mixes": args.mix_values,
        "repeat": args.repeat,
        "reference_repeat": args.reference_repeat,
        "reference_runs_once_at": GOAL_CASE,
        "skip_reference": args.skip_reference,
        "staleness_ms": STALENESS_MS,
        "gc_enabled_while_timing": args.gc,
    }
    scenarios = None if args.skip_scenarios else capacity_scenarios.run_from_args(args)
    if args.scenarios_only:
        assert scenarios is not None
        if args.json:
            print(json.dumps({"environment": env, "scenarios": capacity_scenarios.as_json(scenarios)}, indent=2))
        else:
            capacity_scenarios.print_from_args(scenarios, args)
        return 0
    rows = [
        run_case(
            case,
            cap,
            mix,
            seed=args.seed,
            repeat=args.repeat,
            reference_repeat=args.reference_repeat,
            skip_reference=args.skip_reference,
            collect=args.gc,
        )
        for case in args.cases
        for mix in args.mix_values
        for cap in args.cap_values
    ]
    if args.json:
        report = {"environment": env, "config": config, "cases": [asdict(r) for r in rows], "goals": goals(rows)}
        if scenarios is not None:
            report["scenarios"] = capacity_scenarios.as_json(scenarios)
        print(json.dumps(report, indent=2))
    else:
        print_table(rows, env, config)
        if scenarios is not None:
            capacity_scenarios.print_from_args(scenarios, args)
    return 1 if any(row.identical is False for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

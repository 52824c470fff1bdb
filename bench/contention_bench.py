"""Benchmark of compare-and-set promotions on PostgreSQL while cancels hit the same jobs from other processes.

Each mode gets a scratch PostgreSQL database on 127.0.0.1:5432 (dropped after), filled with ``--jobs``
queued GPU jobs (the store's own admission columns, inserted in bulk: filling is not timed). Then,
from separate processes (``multiprocessing``, each with its own engine and connections):

- **baseline**: one promoter and no cancels. The promoter applies a promotion for every job, in
  batches of ``--batch`` (400, what a tick of 50 peers capped at 8 promotes) through the tick's own
  write path, ``FederationStore.apply_promotions`` (one transaction per batch, a compare-and-set
  per job: queued and uncancelled; a history event; the end of its hold).
- **contention**: ``--promoters`` promoters (2, as two overlapping ticks with the same stale queue
  would) each promoting every job, in the same order, to different peers, while ``--cancellers``
  cancellers (2) each cancel the same ``--cancel-fraction`` (0.3) of the jobs through
  ``FederationStore.request_cancel`` (what the UI, the API and a killed task call), one
  transaction per cancel, in the promoters' order reversed (each from its own starting point), so
  that cancels meet promotions under way: earlier they find jobs queued, later jobs promoted.

It prints promotions per second (confirmed compare-and-sets over the promoters' wall time) in
both modes and their ratio, then counts from the final database state and the history events:

- **double promotions**: a job with more than one ``promoted`` event, a job confirmed by more than
  one promoter, or a job whose incarnation (nonce) changed;
- **promoted after cancel**: a job whose ``cancel_requested`` event precedes a ``promoted`` event
  (events of one job are written under its row lock, so their order is the commit order), or whose
  cancel committed yet it is still live (queued, pending or handed off, not ended).

The exit status is 1 if either count is not zero. Run from the repository root::

    nice .venv/bin/python -m bench.contention_bench
    nice .venv/bin/python -m bench.contention_bench --jobs 50000 --promoters 2 --cancellers 4 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/contention_bench.py``: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.placement_bench import environment
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.store.common import TERMINAL_VALUES
from iris_airflow_provider.store.jobs import incarnation
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.schema import job_events, jobs
from iris_airflow_provider.store.store import FederationStore

GOAL_PER_SECOND = 1000.0
SUBMITTED_MS = 1_700_000_000_000


def job_ids(count: int) -> list[str]:
    return [f"/bench/contended-{index:06d}" for index in range(count)]


def fill(url: str, ids: Sequence[str]) -> dict[str, str]:
    """Queued jobs as admission writes them; returns each one's incarnation (nonce)."""
    store = FederationStore.from_url(url)
    try:
        store.migrate()
        rows = []
        for job_id in ids:
            spec = JobSpec.model_validate(
                {"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}}}
            )
            new = NewIncarnation(spec=spec, direction=Direction.SENT, submitting_user="bench@example.com")
            rows.append({"job_id": job_id, "updated_at_ms": SUBMITTED_MS, **incarnation(new, SUBMITTED_MS)})
        with store.engine.begin() as connection:
            for start in range(0, len(rows), 2000):
                connection.execute(sa.insert(jobs), rows[start : start + 2000])
        # Fresh statistics, as autovacuum would gather within a minute of the inserts. Without them the
        # planner may find a promotion's row through (direction, handoff_state) instead of the primary
        # key, scanning every queued job: about 40x slower per compare-and-set, measured here.
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("ANALYZE")
        return {row["job_id"]: row["nonce"] for row in rows}
    finally:
        store.dispose()


def _now_ms() -> int:
    return int(time.time() * 1000)


def promoter(url: str, peer_id: str, ids: Sequence[str], batch: int, ready: Any, results: Any) -> None:
    """Promote every job to ``peer_id``, ``batch`` per transaction, through the tick's write path."""
    store = FederationStore.from_url(url)
    try:
        store.get_job("")  # connected before the common start
        ready.wait()
        started = time.perf_counter()
        confirmed: list[str] = []
        for start in range(0, len(ids), batch):
            promotions = [
                Promotion(job_id, peer_id, "default", False, {"h100": 8}, None) for job_id in ids[start : start + batch]
            ]
            confirmed.extend(promotion.job_id for promotion in store.apply_promotions(promotions, _now_ms()))
        results.put(("promoter", peer_id, time.perf_counter() - started, confirmed))
    except Exception as error:  # e.g. a deadlock PostgreSQL broke: the run fails, saying so
        results.put(("error", peer_id, 0.0, repr(error)))
    finally:
        store.dispose()


def canceller(url: str, name: str, ids: Sequence[str], ready: Any, results: Any) -> None:
    """Cancel these jobs one transaction each, as the UI, the API or a killed task would."""
    store = FederationStore.from_url(url)
    try:
        store.get_job("")
        ready.wait()
        started = time.perf_counter()
        killed = 0
        for job_id in ids:
            killed += bool(store.request_cancel(job_id, _now_ms()).killed)
        results.put(("canceller", name, time.perf_counter() - started, killed))
    except Exception as error:
        results.put(("error", name, 0.0, repr(error)))
    finally:
        store.dispose()


def cancel_orders(to_cancel: Sequence[str], cancellers: int) -> list[list[str]]:
    """Each canceller's order: the promoters' order reversed, so that cancels meet the promotions
    (before, cancels find queued jobs; after, promoted ones), each canceller starting at its own
    point of that order (they meet each other's jobs too)."""
    backwards = list(reversed(to_cancel))
    orders = []
    for index in range(cancellers):
        start = len(backwards) * index // max(cancellers, 1)
        orders.append(backwards[start:] + backwards[:start])
    return orders


@dataclass
class Outcome:
    mode: str
    jobs: int
    promoters: int
    cancellers: int
    cancels_per_canceller: int
    seconds: float = 0.0  # the promoters' wall time, from the common start to the last one's end
    promoted: int = 0  # confirmed compare-and-sets, over all promoters
    attempted: int = 0  # compare-and-sets tried, over all promoters
    per_second: float = 0.0
    cancel_seconds: float = 0.0
    cancels_that_killed: int = 0
    cancelled_jobs: int = 0
    cancelled_while_queued: int = 0  # cancel committed first: the job was never promoted
    cancelled_after_promotion: int = 0  # promoted first, then the cancel ended it (before any delivery)
    double_promotions: int = 0
    promoted_after_cancel: int = 0
    examples: list[str] = field(default_factory=list)


def run_mode(mode: str, args: argparse.Namespace) -> Outcome:
    from tests.postgres import scratch_database

    promoters, cancellers = (1, 0) if mode == "baseline" else (args.promoters, args.cancellers)
    ids = job_ids(args.jobs)
    rng = random.Random(args.seed)
    to_cancel = sorted(rng.sample(ids, int(len(ids) * args.cancel_fraction))) if cancellers else []
    outcome = Outcome(mode, len(ids), promoters, cancellers, len(to_cancel))
    context = multiprocessing.get_context("spawn")
    with scratch_database("iris_contention_bench") as url:
        nonces = fill(url, ids)
        ready = context.Barrier(promoters + cancellers + 1)
        results = context.Queue()
        processes = [
            context.Process(target=promoter, args=(url, f"peer-{index}", ids, args.batch, ready, results))
            for index in range(promoters)
        ] + [
            context.Process(target=canceller, args=(url, f"canceller-{index}", order, ready, results))
            for index, order in enumerate(cancel_orders(to_cancel, cancellers))
        ]
        for process in processes:
            process.start()
        ready.wait()
        confirmed_by: dict[str, list[str]] = {}
        for _ in processes:
            kind, name, seconds, value = results.get(timeout=3600)
            if kind == "error":
                raise SystemExit(f"{name} failed: {value}")
            if kind == "promoter":
                outcome.seconds = max(outcome.seconds, seconds)
                outcome.attempted += len(ids)
                for job_id in value:
                    confirmed_by.setdefault(job_id, []).append(name)
            else:
                outcome.cancel_seconds = max(outcome.cancel_seconds, seconds)
                outcome.cancels_that_killed += value
        for process in processes:
            process.join()
            if process.exitcode != 0:
                raise SystemExit(f"{process.name} exited with {process.exitcode}")
        outcome.promoted = sum(len(names) for names in confirmed_by.values())
        outcome.per_second = outcome.promoted / outcome.seconds if outcome.seconds else 0.0
        count(url, outcome, confirmed_by, nonces)
    return outcome


def count(url: str, outcome: Outcome, confirmed_by: dict[str, list[str]], nonces: dict[str, str]) -> None:
    """Double promotions and promotions after a cancel, from the final state and the history."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            events: dict[str, list[tuple[int, str]]] = {}
            query = sa.select(job_events.c.job_id, job_events.c.seq, job_events.c.kind).where(
                job_events.c.kind.in_(["promoted", "cancel_requested"])
            )
            for job_id, seq, kind in connection.execute(query):
                events.setdefault(job_id, []).append((seq, kind))
            final = {
                row.job_id: row
                for row in connection.execute(
                    sa.select(
                        jobs.c.job_id, jobs.c.state, jobs.c.nonce, jobs.c.cancel_intent_version, jobs.c.handoff_state
                    )
                )
            }
    finally:
        engine.dispose()
    double: set[str] = {job_id for job_id, names in confirmed_by.items() if len(names) > 1}
    after_cancel: set[str] = set()
    for job_id, history in events.items():
        history.sort()
        kinds = [kind for _, kind in history]
        if kinds.count("promoted") > 1:
            double.add(job_id)
        if "cancel_requested" in kinds:
            first_cancel = kinds.index("cancel_requested")
            if "promoted" in kinds[first_cancel:]:
                after_cancel.add(job_id)
            elif "promoted" in kinds:
                outcome.cancelled_after_promotion += 1
            else:
                outcome.cancelled_while_queued += 1
    for job_id, row in final.items():
        if row.cancel_intent_version > 0:
            outcome.cancelled_jobs += 1
            if row.state not in TERMINAL_VALUES:
                after_cancel.add(job_id)
    # A second incarnation of a job would carry a new nonce.
    double.update(job_id for job_id, row in final.items() if row.nonce != nonces[job_id])
    outcome.double_promotions = len(double)
    outcome.promoted_after_cancel = len(after_cancel)
    outcome.examples = sorted(double | after_cancel)[:5]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5_000, help="queued jobs per mode (default 5000)")
    parser.add_argument("--batch", type=int, default=400, help="promotions per transaction (default 400)")
    parser.add_argument("--promoters", type=int, default=2, help="promoter processes under contention (default 2)")
    parser.add_argument("--cancellers", type=int, default=2, help="canceller processes (default 2)")
    parser.add_argument("--cancel-fraction", type=float, default=0.3, help="jobs cancelled, 0..1 (default 0.3)")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    for name in ("jobs", "batch", "promoters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    if args.cancellers < 0:
        parser.error(f"--cancellers: must be 0 or more, got {args.cancellers}")
    if not 0.0 <= args.cancel_fraction <= 1.0:
        parser.error(f"--cancel-fraction: must be between 0 and 1, got {args.cancel_fraction}")
    env = environment()
    outcomes = [run_mode(mode, args) for mode in ("baseline", "contention")]
    env["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    baseline, contended = outcomes
    ratio = contended.per_second / baseline.per_second if baseline.per_second else 0.0
    failed = any(outcome.double_promotions or outcome.promoted_after_cancel for outcome in outcomes)
    if args.json:
        print(json.dumps({"environment": env, "outcomes": [asdict(o) for o in outcomes], "ratio": ratio}, indent=2))
        return 1 if failed else 0
    print(
        f"Python {env['python']}, {env['usable_cpus']} CPUs, load average {env['load_average_1m']} before, "
        f"{env['load_average_1m_after']} after; PostgreSQL on 127.0.0.1:5432"
    )
    print(f"{args.jobs:,} queued jobs per mode, {args.batch} promotions per transaction")
    print()
    header = (
        "mode",
        "promoters",
        "cancellers",
        "promoted",
        "seconds",
        "promotions/s",
        "CAS tried/s",
        "cancelled: while queued / after promotion",
        "double",
        "after cancel",
    )
    print(" | ".join(header))
    for o in outcomes:
        print(
            " | ".join(
                (
                    o.mode,
                    str(o.promoters),
                    f"{o.cancellers} x {o.cancels_per_canceller:,}",
                    f"{o.promoted:,}",
                    f"{o.seconds:.2f}",
                    f"{o.per_second:,.0f}",
                    f"{o.attempted / o.seconds:,.0f}" if o.seconds else "-",
                    f"{o.cancelled_while_queued:,} / {o.cancelled_after_promotion:,}",
                    str(o.double_promotions),
                    str(o.promoted_after_cancel),
                )
            )
        )
    print()
    print(f"contention / baseline promotions per second: {ratio:.2f}")
    for o in outcomes:
        goal = "met" if o.per_second >= GOAL_PER_SECOND else "NOT met"
        print(
            f"{o.mode}: {o.per_second:,.0f} promotions/s (goal {GOAL_PER_SECOND:,.0f}/s: {goal})"
            + (f"; cancels took {o.cancel_seconds:.2f} s" if o.cancellers else "")
        )
        if o.examples:
            print(
                f"  FAILED: double promotions {o.double_promotions}, promoted after cancel {o.promoted_after_cancel}: "
                + ", ".join(o.examples)
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

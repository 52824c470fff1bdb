"""Retention at scale: what one tick's prune costs with 1M finished jobs in a PostgreSQL store.

Fills a scratch database server-side (``generate_series``) with N finished jobs, each with two
history events and two output lines, then times the tick's retention step (``prune_finished``:
one batch of jobs with their events and output, plus superseded output) a few times in a row.
The baseline is the same step on a store of ``--baseline`` jobs, measured in the same run: the
ratio says whether a batch's cost stays bounded as the store grows (1.0 = independent of size).

    .venv/bin/python -m bench.prune_bench [--jobs 1000000] [--baseline 10000] [--batches 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import sqlalchemy as sa

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from iris_airflow_provider.services import retention
from iris_airflow_provider.services.retention import prune_finished
from iris_airflow_provider.store.store import FederationStore

DAY_MS = 86_400_000
FILL = [
    """INSERT INTO iris_jobs (job_id, direction, state, nonce, priority_band, submitted_at_ms, spec,
           updated_at_ms, finished_at_ms)
       SELECT '/alice/j' || g, 'local', 'succeeded', 'n' || g, 'PRIORITY_BAND_BATCH', g,
              '{"command": ["true"]}'::jsonb, g, g
       FROM generate_series(1, :n) AS g""",
    """INSERT INTO iris_job_events (job_id, at_ms, kind, state)
       SELECT '/alice/j' || g, g, kind, 'succeeded'
       FROM generate_series(1, :n) AS g, (VALUES ('admitted'), ('reported')) AS k(kind)""",
    """INSERT INTO iris_job_logs (job_id, nonce, at_ms, line)
       SELECT '/alice/j' || g, 'n' || g, g, 'line ' || i
       FROM generate_series(1, :n) AS g, generate_series(1, 2) AS i""",
    "ANALYZE",
]


def measure(url: str, jobs: int, batches: int) -> dict[str, Any]:
    store = FederationStore.from_url(url)
    try:
        store.migrate()
        started = time.perf_counter()
        with store.engine.begin() as connection:
            for statement in FILL:
                connection.execute(sa.text(statement), {"n": jobs} if ":n" in statement else {})
        fill_s = time.perf_counter() - started
        now = jobs + 2 * DAY_MS  # every job ended more than a day before
        timings, pruned = [], 0
        for _ in range(batches):
            started = time.perf_counter()
            pruned += len(prune_finished(store, now, DAY_MS))
            timings.append(time.perf_counter() - started)
        with store.engine.connect() as connection:
            left = connection.execute(sa.text("SELECT count(*) FROM iris_jobs")).scalar_one()
        return {
            "jobs": jobs,
            "fill_s": round(fill_s, 1),
            "batch_ms_median": round(statistics.median(timings) * 1000, 1),
            "batch_ms_max": round(max(timings) * 1000, 1),
            "pruned": pruned,
            "left": left,
            "jobs_per_s": round(pruned / sum(timings)),
        }
    finally:
        store.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from tests.postgres import scratch_database

    results = []
    for jobs in (args.baseline, args.jobs):
        with scratch_database("iris_prune_bench") as url:
            results.append(measure(url, jobs, args.batches))
    baseline, large = results
    ratio = large["batch_ms_median"] / baseline["batch_ms_median"]
    summary = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "batch_size": retention.PRUNE_BATCH,
        "results": results,
        "ratio_large_to_baseline": round(ratio, 2),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"python {summary['python']}, {summary['cpus']} cpus, load {summary['load']}")
    print(f"one tick's prune: a batch of {retention.PRUNE_BATCH} finished jobs with their events and output")
    print(f"{'jobs':>10} {'fill s':>8} {'batch ms (median)':>18} {'max':>8} {'jobs/s':>8} {'left':>10}")
    for r in results:
        print(
            f"{r['jobs']:>10,} {r['fill_s']:>8} {r['batch_ms_median']:>18} {r['batch_ms_max']:>8} "
            f"{r['jobs_per_s']:>8,} {r['left']:>10,}"
        )
    print(f"ratio {large['jobs']:,} : {baseline['jobs']:,} jobs = {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

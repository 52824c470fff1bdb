"""Submit-to-promotion latency through real Airflow services (a benchmark, not a test).

Starts a real deployment (api-server, scheduler, dag-processor, triggerer; the parent ``marin``
with the ``cw-h100`` and ``cw-gb200`` process peers), then triggers ``federated_job`` through the
REST API once per sample, for a job some peer has free capacity for, one at a time, and reads
the job's history from the federation store. It prints, per sample and as median / p90 / max:

- trigger -> queued: the REST call until the operator admitted the job (task start-up included);
- queued -> promoted: until a placement tick promoted it (the wake trigger plus a DAG run);
- queued -> running: until the peer reported it running;
- trigger -> promoted;

and queued -> promoted step by step, from the placement DAG run that promoted the job (its asset
event, its run and its task instance, read through the REST API):

- wake: queued until the wake trigger's asset event (its store poll, every second);
- run created: until the scheduler created the placement DAG run for that event;
- task started: until its ``tick`` task started (scheduling, the executor, the task's start-up);
- tick: until the tick promoted the job (the task's imports, heartbeats, the queue read, the pass).

A promotion by a run the interval timetable started (no asset event) has no wake step and counts
the run's creation from the job's admission. The figures depend on the machine; the first sample
after start-up is excluded as a warm-up.

    .venv/bin/python -m bench.latency_bench [--samples 10] [--postgres] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from devtools.airflow_deployment import REPO, AirflowDeployment
from iris_airflow_provider.store.store import FederationStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--postgres", action="store_true", help="metadata database and store on PostgreSQL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="iris-latency-")))
        if args.postgres:
            from tests.postgres import scratch_database

            metadata_url = stack.enter_context(scratch_database("iris_bench_meta"))
            store_url = stack.enter_context(scratch_database("iris_bench_store"))
        else:
            metadata_url, store_url = f"sqlite:///{home}/airflow.db", f"sqlite:///{home}/store.db"
        cluster = home / "cluster.yaml"
        cluster.write_text((REPO / "examples" / "cluster-demo.yaml").read_text())
        deployment = AirflowDeployment(
            home=home, port=_free_port(), metadata_url=metadata_url, store_url=store_url, cluster_config=cluster
        )
        stack.callback(deployment.stop)
        deployment.start()
        deployment.wait_for_dag("federated_job")
        deployment.wait_for_dag("iris_federation_tick")
        store = FederationStore.from_url(store_url)
        stack.callback(store.dispose)
        samples = [_sample(deployment, store, i) for i in range(args.samples + 1)][1:]  # the first warms up

    columns = (
        "trigger_to_queued",
        "queued_to_promoted",
        "queued_to_running",
        "trigger_to_promoted",
        *(f"step_{step}" for step in STEPS),
    )
    summary = {
        column: {
            "median_s": statistics.median(s[column] for s in samples),
            "p90_s": _percentile([s[column] for s in samples], 0.9),
            "max_s": max(s[column] for s in samples),
        }
        for column in columns
    }
    environment = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "database": "postgresql" if args.postgres else "sqlite",
        "samples": len(samples),
    }
    if args.json:
        json.dump({"environment": environment, "samples": samples, "summary": summary}, sys.stdout, indent=2)
        print()
        return 0
    print(f"Submit-to-promotion latency through real Airflow services ({environment})")
    print(f"{'sample':>6}  " + "  ".join(f"{c:>20}" for c in columns))
    for i, sample in enumerate(samples, 1):
        print(f"{i:>6}  " + "  ".join(f"{sample[c]:>19.2f}s" for c in columns))
    for statistic in ("median_s", "p90_s", "max_s"):
        print(f"{statistic[:-2]:>6}  " + "  ".join(f"{summary[c][statistic]:>19.2f}s" for c in columns))
    return 0


def _sample(deployment: AirflowDeployment, store: FederationStore, index: int) -> dict[str, float]:
    job = {"command": "sleep 1", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
    triggered = time.time()
    run_id = deployment.trigger("federated_job", {"job": job}, user="alice")
    deployment.wait_for_run("federated_job", run_id, timeout=120)
    record = next(j for j in store.list_jobs(limit=10_000) if j.origin and j.origin.run_id == run_id)
    at: dict[str, float] = {}
    for event in store.events(record.job_id):
        at.setdefault(event.kind if event.kind != "reported" else f"reported:{event.state}", event.at_ms / 1000)
    return {
        "trigger_to_queued": at["admitted"] - triggered,
        "queued_to_promoted": at["promoted"] - at["admitted"],
        "queued_to_running": at.get("reported:running", at.get("handed_off", at["promoted"])) - at["admitted"],
        "trigger_to_promoted": at["promoted"] - triggered,
        **{f"step_{step}": seconds for step, seconds in _steps(deployment, at["admitted"], at["promoted"]).items()},
    }


STEPS = ("wake", "run_created", "task_started", "tick")


def _steps(deployment: AirflowDeployment, admitted: float, promoted: float) -> dict[str, float]:
    """Queued -> promoted split at the placement run that promoted the job (see the module docstring)."""
    runs = deployment.api(
        "GET", "/api/v2/dags/iris_federation_tick/dagRuns", params={"order_by": "-run_after", "limit": 50}
    )
    runs.raise_for_status()
    for run in runs.json()["dag_runs"]:
        task = deployment.task_instance("iris_federation_tick", run["dag_run_id"], "tick")
        if not (task.get("start_date") and task.get("end_date")):
            continue
        started, ended = _epoch(task["start_date"]), _epoch(task["end_date"])
        if not started <= promoted <= ended:
            continue
        created = _epoch(run["queued_at"])
        events = deployment.api(
            "GET", f"/api/v2/dags/iris_federation_tick/dagRuns/{run['dag_run_id']}/upstreamAssetEvents"
        )
        events.raise_for_status()
        woken = [_epoch(e["timestamp"]) for e in events.json()["asset_events"] if _epoch(e["timestamp"]) >= admitted]
        wake = min(woken) if woken else admitted
        return {
            "wake": wake - admitted,
            "run_created": created - wake,
            "task_started": started - created,
            "tick": promoted - started,
        }
    raise RuntimeError(f"no placement run's tick task spans the promotion at {promoted:.3f}")


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())

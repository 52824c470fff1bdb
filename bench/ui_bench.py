"""Federation page API response times with 10,000 jobs (a benchmark, not a test).

Fills a fresh store with ``--jobs`` jobs (default 10,000: finished, running, handed off, queued,
local and received, from many users, DAGs and peers), then times the requests the page makes,
through the plugin's real FastAPI app (in process, with Starlette's test client: no network) and
Airflow's real auth manager with a real token:

- ``jobs (page 1)``, ``jobs (page 100)``, and the list under each filter the page offers;
- ``describe`` and ``explain`` of a queued job (``explain`` runs the placement pass over every
  queued job, as a tick would), and ``peers``;
- the same list as a user allowed on a few DAGs only (the authorization scope in SQL).

Each request runs ``--repeat`` times (20) after one warm-up; it prints median, p95 and max in ms.

    .venv/bin/python -m bench.ui_bench [--jobs 10000] [--postgres] [--repeat 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

_HOME = tempfile.mkdtemp(prefix="iris-ui-bench-")
# Airflow reads its configuration at import: a throwaway home, metadata database and users first.
os.environ.update(
    {
        "AIRFLOW_HOME": _HOME,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{_HOME}/passwords.json",
        "AIRFLOW__API_AUTH__JWT_SECRET": "iris-ui-bench-" + "0123456789abcdef" * 5,
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
)

CLUSTER = """
name: marin
state_dir: {state_dir}
backends: [{{id: cpu, kind: process}}]
peers:
{peers}
"""
STATES = [("succeeded", 55), ("failed", 5), ("killed", 5), ("running", 15), ("pending", 20)]


def fill(store: Any, jobs: int, peers: list[str], seed: int) -> dict[str, Any]:
    """Rows as the operator and the tick write them, inserted in bulk (timing the inserts is not the point)."""
    import sqlalchemy as sa

    from iris_airflow_provider.store.schema import jobs as table

    rng = random.Random(seed)
    now = int(time.time() * 1000)
    users = [f"user{i:03d}" for i in range(200)]
    dags = [f"team{i:02d}_train" for i in range(40)]
    rows, queued = [], []
    for index in range(jobs):
        state = rng.choices([s for s, _ in STATES], [w for _, w in STATES])[0]
        direction = rng.choices(["sent", "local", "received"], [80, 15, 5])[0]
        user, dag = rng.choice(users), rng.choice(dags)
        run_id = f"manual__{index:06d}"
        job_id = f"/{user}/{dag}.run.{run_id}"
        variant = rng.choice(["h100", "gb200", "a100"])
        count = rng.choice([1, 2, 4, 8])
        handoff, peer, backend = None, "", ""
        if direction == "sent":
            handoff = "queued" if state == "pending" else "handed_off"
            peer = "" if handoff == "queued" else rng.choice(peers)
            backend = "" if handoff == "queued" else "default"
            if handoff == "queued":
                queued.append(job_id)
        elif direction == "local":
            backend = "cpu"
        else:
            peer, backend = "parent", "cpu"
        spec = {
            "job_id": job_id,
            "command": ["/bin/sh", "-c", "python train.py"],
            "image": "",
            "env": {},
            "files": {},
            "resources": {"device": {"type": "gpu", "variant": variant, "count": count}, "replicas": 1},
            "constraints": [],
            "priority_band": rng.choice(["PRIORITY_BAND_BATCH", "PRIORITY_BAND_INTERACTIVE"]),
            "target_cluster": "",
        }
        submitted = now - (jobs - index) * 1000
        terminal = state in ("succeeded", "failed", "killed")
        rows.append(
            {
                "job_id": job_id,
                "direction": direction,
                "handoff_state": handoff,
                "state": state,
                "peer_id": peer,
                "backend_id": backend,
                "owner_principal": user,
                "submitting_user": user,
                "nonce": f"{index:032x}",
                "priority_band": spec["priority_band"],
                "submitted_at_ms": submitted,
                "spec": spec,
                "updated_at_ms": submitted,
                "finished_at_ms": submitted + 60_000 if terminal else None,
                "reported_at_ms": submitted + 1000 if handoff == "handed_off" else None,
                "origin_dag_id": None if direction == "received" else dag,
                "origin_run_id": None if direction == "received" else run_id,
                "origin_task_id": None if direction == "received" else "run",
                "origin_map_index": None if direction == "received" else -1,
            }
        )
    with store.engine.begin() as connection:
        for start in range(0, len(rows), 1000):
            connection.execute(sa.insert(table), rows[start : start + 1000])
    return {"queued": queued, "users": users, "dags": dags}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--postgres", action="store_true", help="the store on a scratch PostgreSQL database")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from airflow.api_fastapi.app import get_auth_manager, init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.utils.db import resetdb
    from fastapi.testclient import TestClient

    from iris_airflow_provider.cluster.build import build_federation
    from iris_airflow_provider.cluster.config import load_cluster_config
    from iris_airflow_provider.plugins import ui_api
    from iris_airflow_provider.store.store import FederationStore

    resetdb()  # token checks read Airflow's revoked-token table
    init_auth_manager()
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))

    with ExitStack() as stack:
        if args.postgres:
            from tests.postgres import scratch_database

            url = stack.enter_context(scratch_database("iris_ui_bench"))
        else:
            url = f"sqlite:///{_HOME}/federation.db"
        store = FederationStore.from_url(url)
        store.migrate()
        peers = [f"cw-{i:02d}" for i in range(args.peers)]
        peer_yaml = "\n".join(
            f"  - {{id: {p}, kind: agentless, backends: [{{id: default, kind: process, devices: {{h100: 8}}}}]}}"
            for p in peers
        )
        path = Path(_HOME) / "cluster.yaml"
        path.write_text(CLUSTER.format(state_dir=Path(_HOME) / "iris", peers=peer_yaml))
        config = load_cluster_config(path)
        federation = build_federation(config, store)
        federation.peer_states(refresh_stale=True)
        started = time.perf_counter()
        seeded = fill(store, args.jobs, peers, args.seed)
        fill_s = time.perf_counter() - started

        ui_api.app.dependency_overrides[ui_api.federation] = lambda: federation
        client = stack.enter_context(TestClient(ui_api.app))
        headers = {"Authorization": f"Bearer {token}"}
        queued = seeded["queued"][len(seeded["queued"]) // 2]
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("jobs (page 1)", "/api/jobs", {}),
            ("jobs (page 100)", "/api/jobs", {"offset": 99 * 50}),
            ("jobs state=pending", "/api/jobs", {"state": "pending"}),
            ("jobs peer=cw-03", "/api/jobs", {"peer": "cw-03"}),
            ("jobs submitter=user042", "/api/jobs", {"submitter": "user042"}),
            ("jobs q=team07 (substring)", "/api/jobs", {"q": "team07"}),
            ("jobs active=true", "/api/jobs", {"active": "true"}),
            ("describe (queued job)", "/api/jobs/describe", {"job_id": queued}),
            (f"explain (1 of {len(seeded['queued'])} queued)", "/api/jobs/explain", {"job_id": queued}),
            ("peers", "/api/peers", {}),
        ]
        results = []
        for name, path_, params in cases:
            results.append(_time(client, name, path_, params, headers, args.repeat))
        # A user allowed on a few DAGs only: the scope becomes an IN list in SQL.
        scoped = _scoped_manager(set(seeded["dags"][:3]))
        alice = scoped.generate_jwt(SimpleAuthManagerUser(username="alice", role="user"))
        results.append(
            _time(
                client,
                "jobs as a user on 3 of 40 DAGs",
                "/api/jobs",
                {},
                {"Authorization": f"Bearer {alice}"},
                args.repeat,
            )
        )
        store.dispose()

    report = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "store": "postgresql" if args.postgres else "sqlite",
        "jobs": args.jobs,
        "queued": len(seeded["queued"]),
        "fill_seconds": round(fill_s, 2),
        "results": results,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"Python {report['python']}, {report['cpus']} CPUs, load {report['load'][0]:.2f}; store {report['store']}; "
        f"{args.jobs:,} jobs ({report['queued']:,} queued), filled in {fill_s:.1f} s; {args.repeat} runs each"
    )
    print(f"{'request':<34} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'rows':>6} {'total':>7}")
    for row in results:
        print(
            f"{row['request']:<34} {row['median_ms']:>10.1f} {row['p95_ms']:>8.1f} {row['max_ms']:>8.1f} "
            f"{row['rows']:>6} {row['total']:>7}"
        )
    return 0


def _time(client: Any, name: str, path: str, params: dict[str, Any], headers: dict[str, str], repeat: int) -> dict:
    response = client.get(path, params=params, headers=headers)  # warm-up (and a check)
    if response.status_code != 200:
        raise SystemExit(f"{name}: {response.status_code} {response.text}")
    body = response.json()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(path, params=params, headers=headers).raise_for_status()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "request": name,
        "median_ms": statistics.median(samples),
        "p95_ms": samples[min(len(samples) - 1, int(len(samples) * 0.95))],
        "max_ms": samples[-1],
        "rows": len(body.get("jobs", [])) if isinstance(body, dict) else 0,
        "total": body.get("total", "") if isinstance(body, dict) else "",
    }


def _scoped_manager(allowed: set[str]) -> Any:
    """Airflow's SimpleAuthManager, with alice allowed on ``allowed`` DAGs only."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    class Scoped(SimpleAuthManager):  # type: ignore[misc]
        def is_authorized_dag(self, *, method, user, access_entity=None, details=None):  # type: ignore[no-untyped-def]
            if user.get_name() == "alice":
                return details is not None and details.id in allowed
            return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    manager = Scoped()
    manager.init()
    airflow_app._AuthManagerState.instance = manager  # a benchmark may reach in; the tests use the config
    return manager


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())

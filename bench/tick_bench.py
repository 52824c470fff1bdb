"""Benchmark of one full placement tick through the store, next to the pure pass on the same state.

For each case (queued GPU jobs x peers, 4 backends per peer) it fills a fresh store (SQLite, or a
scratch PostgreSQL database on 127.0.0.1:5432, dropped after) with queued jobs, as admission writes them (the
store's own ``incarnation`` columns, inserted in bulk: timing the inserts is not the point), then
times one ``Federation.tick()``: heartbeats from in-memory peers, lost peers, expiry, the queue read
and placement, promotions (compare-and-set), delivery to the in-memory peers, sync, withdrawals,
cancel re-drive, retention. Next to it, the pure pass (``placement_snapshot.place``, that is
``placement.plan``; best of ``--repeat`` runs, garbage collector off as ``timeit`` does) on the
same state built in memory (candidates parsed from the same specs, the peers as they answer), with
the tick's own rules, and checks both promote the same jobs to the same backends and expire the
same jobs. The peers and the job mix are the GPU mix of ``bench/placement_bench.py`` (scarce
capacity, four variants, four bands, region constraints, pinned jobs, a few past their deadline).

The first tick is timed once per case (it changes the state: it promotes, expires and saves
holds). Then the queue read on its own (``services.placement.placement_snapshot``), and the next
tick on what the first left (the same queue less what it placed, jobs in flight, holds), next to
the pure pass on the snapshot the store gives for it: the steady state, where little is promoted.
Both ticks' decisions are checked against their pure pass. Before each timed tick the
benchmark's own input is frozen out of the garbage collector's way (``gc.freeze``): a tick's
process does not hold N parsed specs, and a full collection walking them was over a second per
tick at 100k; the tick's own allocations are still collected as usual.

Run from the repository root::

    nice .venv/bin/python -m bench.tick_bench                      # 1k and 10k, SQLite then PostgreSQL
    nice .venv/bin/python -m bench.tick_bench --sizes 1k,10k,100k  # 100k: minutes on 2 cores (filling)
    nice .venv/bin/python -m bench.tick_bench --stores postgresql --sizes 100k --json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/tick_bench.py``: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.placement_bench import (
    BANDS,
    NOW_MS,
    REGIONS,
    STALENESS_MS,
    Case,
    _best_of,
    _weighted,
    environment,
    generate,
)
from iris_airflow_provider.backends.base import JobReport, LogChunk
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.availability import PeerBackend, PeerState
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_snapshot import PlacementSnapshot, place
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.peers.base import Handoff, SyncResult, Termination
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.placement import placement_snapshot
from iris_airflow_provider.store.jobs import incarnation
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.schema import jobs as jobs_table
from iris_airflow_provider.store.store import FederationStore

CASES = {
    case.name: case for case in (Case("1k", 1_000, 50, 4), Case("10k", 10_000, 50, 4), Case("100k", 100_000, 50, 4))
}
GOAL_CASE, GOAL_STORE = "100k", "postgresql"
GOAL_SECONDS, GOAL_RATIO = 1.0, 3.0


class InMemoryPeer:
    """A peer answering from memory: its backends as generated, and whatever it is handed stays pending."""

    kind = "agentless"
    address = ""

    def __init__(self, peer_id: str, backends: Sequence[PeerBackend]) -> None:
        self.peer_id = peer_id
        self.backends = list(backends)
        self.jobs: dict[str, JobReport] = {}

    def heartbeat(self) -> list[PeerBackend]:
        return self.backends

    def deliver(self, handoff: Handoff) -> JobReport:
        report = self.jobs.get(handoff.job_id)
        if report is None or report.nonce != handoff.nonce:
            report = JobReport(handoff.job_id, handoff.nonce, JobState.PENDING, handoff.backend_id)
            self.jobs[handoff.job_id] = report
        return report

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        reports = {job_id: self.jobs[job_id] for job_id in job_ids if job_id in self.jobs}
        return SyncResult(reports, frozenset(job_ids) - reports.keys(), cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        return self.jobs.pop(job_id, None) is not None

    def terminate(self, job_id: str, nonce: str) -> Termination:
        return Termination.ENDED if self.jobs.pop(job_id, None) else Termination.NOT_FOUND

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        return LogChunk((), cursor)


class FixedClock:
    def __call__(self) -> int:
        return NOW_MS


def job_specs(rng: random.Random, count: int, peer_ids: Sequence[str]) -> list[tuple[JobSpec, int]]:
    """Queued GPU jobs as users submit them (the GPU mix of placement_bench), with their submit times."""
    out = []
    for index in range(count):
        variant = _weighted(rng, [("h100", 40), ("a100", 25), ("h200", 20), ("gb200", 15)])
        raw: dict[str, Any] = {
            "job_id": f"/bench/job-{index:06d}",
            "command": ["python", "train.py", "--epochs", "3"],
            "image": "ghcr.io/example/train:1.2",
            "env": {"WANDB_PROJECT": "bench", "SEED": str(index)},
            "resources": {
                "device": {"type": "gpu", "variant": variant, "count": rng.choice((1, 2, 4, 8))},
                "replicas": rng.choice((1, 1, 1, 2, 4)),
            },
            "priority_band": _weighted(
                rng, [(band.wire_name, weight) for band, weight in zip(BANDS, (10, 20, 40, 30), strict=True)]
            ),
        }
        roll = rng.random()
        if roll < 0.10:
            raw["regions"] = [rng.choice(REGIONS)]
        elif roll < 0.15:
            raw["regions"] = sorted(rng.sample(REGIONS, 2))
        if rng.random() < 0.05:
            raw["target_cluster"] = rng.choice(peer_ids) if rng.random() < 0.95 else "ghost-peer"
        if rng.random() < 0.03:
            raw["scheduling_deadline_ms"] = NOW_MS + rng.choice((-60_000, 60_000))
        out.append((JobSpec.model_validate(raw), NOW_MS - rng.randrange(0, 3_600_000)))
    return out


def fill(store: FederationStore, specs: Sequence[tuple[JobSpec, int]]) -> None:
    rows = []
    for spec, submitted in specs:
        new = NewIncarnation(spec=spec, direction=Direction.SENT, submitting_user="bench@example.com")
        rows.append({"job_id": new.job_id, "updated_at_ms": submitted, **incarnation(new, submitted)})
    with store.engine.begin() as connection:
        for start in range(0, len(rows), 2000):
            connection.execute(sa.insert(jobs_table), rows[start : start + 2000])


@contextmanager
def store_for(kind: str, directory: Path, name: str) -> Iterator[FederationStore]:
    if kind == "postgresql":
        from tests.postgres import scratch_database

        with scratch_database("iris_tick_bench") as url:
            store = FederationStore.from_url(url)
            try:
                yield store
            finally:
                store.engine.dispose()
    else:
        store = FederationStore.from_url(f"sqlite:///{directory / name}.db")
        try:
            yield store
        finally:
            store.engine.dispose()


def federation(store: FederationStore, peers: dict[str, InMemoryPeer], directory: Path) -> Federation:
    config = parse_cluster_config(
        {
            "name": "bench",
            "state_dir": str(directory / "iris"),
            "placement": {"heartbeat_staleness_seconds": STALENESS_MS // 1000},
            "backends": [{"id": "cpu", "kind": "process"}],
        }
    )
    return Federation(config, store, backends={}, peers=peers, clock=FixedClock(), jitter=lambda: 1.0)


STEPS = (
    ("heartbeats", "heartbeats", "all"),
    ("placement", "placement", "place"),
    ("delivery", "delivery", "deliver"),
    ("sync", "mirror", "sync"),
)


def time_steps(fed: Federation) -> dict[str, float]:
    """Seconds spent in the tick's main steps (filled in as the tick runs): each step's method is
    wrapped on its service instance, which the tick calls through."""
    spent: dict[str, float] = {}
    for name, service_name, method_name in STEPS:
        service = getattr(fed, service_name)
        method = getattr(service, method_name)

        def timed(*args: Any, _method: Callable[..., Any] = method, _name: str = name, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - started

        setattr(service, method_name, timed)
    return spent


def settle_heap() -> None:
    """Before a timed tick: collect, then freeze what is left (``gc.freeze``). The benchmark holds
    its whole input (N parsed specs, candidates, the pure pass's results), which a tick's own
    process does not; unfrozen, a full collection during the tick walks all of it (at 100k, over a
    second per collection). The tick still pays for collecting what it allocates itself."""
    gc.collect()
    gc.freeze()


@dataclass
class Row:
    store: str
    case: str
    jobs: int
    peers: int
    fill_s: float
    tick_s: float
    queue_read_s: float
    pure_s: float
    ratio: float
    steps: dict[str, float]
    next_tick_s: float
    next_pure_s: float
    next_promoted: int
    promoted: int
    delivered: int
    expired: int
    identical: bool


def run_case(kind: str, case: Case, seed: int, repeat: int, directory: Path) -> Row:
    state = generate(case, seed, "gpu")  # the peers only; the jobs are specs, as users submit them
    peer_ids = [peer.peer_id for peer in state.peers]
    specs = job_specs(random.Random(seed + 1), case.jobs, peer_ids)
    peers = {peer.peer_id: InMemoryPeer(peer.peer_id, peer.backends) for peer in state.peers}
    # The same state in memory: candidates parsed from the same specs, the peers as they answer.
    candidates = [Candidate.from_job(spec, submitted) for spec, submitted in specs]
    heard = [
        PeerState(peer.peer_id, True, NOW_MS, tuple(peer.backends), observed_after_ms=NOW_MS) for peer in state.peers
    ]

    with store_for(kind, directory, f"{case.name}-{seed}") as store:
        store.migrate()
        started = time.perf_counter()
        fill(store, specs)
        fill_s = time.perf_counter() - started
        fed = federation(store, peers, directory)
        snapshot = PlacementSnapshot(tuple(candidates), tuple(heard), (), NOW_MS)
        rules = fed.placement_rules  # the tick's own rules (cap per peer, staleness, holding off)
        pure_s, result = _best_of(repeat, lambda: place(snapshot, rules), collect=False)
        expected = sorted(f"{p.job_id}->{p.peer_id}/{p.backend_id or '*'}" for p in result.promotions)
        steps = time_steps(fed)
        settle_heap()
        started = time.perf_counter()
        report = fed.tick()
        tick_s = time.perf_counter() - started
        steps_first = dict(steps)
        # The next tick, on what the first left (jobs in flight, holds): the steady state, where
        # the queue is as long but little is promoted. Its pure pass runs on the snapshot the store gives.
        started = time.perf_counter()
        again = placement_snapshot(store, peer_ids, NOW_MS)
        read_s = time.perf_counter() - started
        pure_next_s, result_next = _best_of(repeat, lambda: place(again, rules), collect=False)
        expected_next = sorted(f"{p.job_id}->{p.peer_id}/{p.backend_id or '*'}" for p in result_next.promotions)
        settle_heap()
        started = time.perf_counter()
        report_next = fed.tick()
        tick_next_s = time.perf_counter() - started
        gc.unfreeze()
    return Row(
        store=kind,
        case=case.name,
        jobs=case.jobs,
        peers=case.peers,
        fill_s=fill_s,
        tick_s=tick_s,
        queue_read_s=read_s,
        pure_s=pure_s,
        ratio=tick_s / pure_s,
        steps=steps_first,
        next_tick_s=tick_next_s,
        next_pure_s=pure_next_s,
        next_promoted=len(report_next.promoted),
        promoted=len(report.promoted),
        delivered=len(report.delivered),
        expired=len(report.expired),
        identical=sorted(report.promoted) == expected
        and sorted(report.expired) == sorted(result.expired)
        and sorted(report_next.promoted) == expected_next,
    )


def print_table(rows: Sequence[Row], env: dict[str, Any]) -> None:
    print(f"python {env['python']}, {env['usable_cpus']} CPU(s), load average {env['load_average_1m']}")
    print(
        f"{'store':<11} {'case':>5} {'queued':>8} {'peers':>5} {'tick s':>8} {'queue read s':>12} "
        f"{'pure pass s':>11} {'tick/pure':>9} {'promoted':>8} {'delivered':>9} {'expired':>7} identical"
    )
    for row in rows:
        print(
            f"{row.store:<11} {row.case:>5} {row.jobs:>8,} {row.peers:>5} {row.tick_s:>8.3f} {row.queue_read_s:>12.3f} "
            f"{row.pure_s:>11.3f} {row.ratio:>8.1f}x {row.promoted:>8} {row.delivered:>9} {row.expired:>7} "
            f"{'yes' if row.identical else 'NO'}"
        )
    print("the next tick, on what the first left (s): tick, pure pass, tick/pure, promoted")
    for row in rows:
        print(
            f"  {row.store:<11} {row.case:>5}: {row.next_tick_s:.3f}, {row.next_pure_s:.3f}, "
            f"{row.next_tick_s / row.next_pure_s:.1f}x, {row.next_promoted}"
        )
    print("where the first tick's time goes (s): " + ", ".join(name for name, _, _ in STEPS) + ", the rest")
    for row in rows:
        named = [row.steps.get(name, 0.0) for name, _, _ in STEPS]
        parts = ", ".join(f"{value:.3f}" for value in [*named, row.tick_s - sum(named)])
        print(f"  {row.store:<11} {row.case:>5}: {parts}")
    for row in rows:
        if (row.case, row.store) == (GOAL_CASE, GOAL_STORE):
            for which, tick_s, pure_s in (
                ("first", row.tick_s, row.pure_s),
                ("next", row.next_tick_s, row.next_pure_s),
            ):
                met = tick_s < GOAL_SECONDS and tick_s / pure_s <= GOAL_RATIO and row.identical
                print(
                    f"goal ({GOAL_CASE} on {GOAL_STORE}: tick under {GOAL_SECONDS:.0f} s, within {GOAL_RATIO:.0f}x of "
                    f"the pure pass, identical decisions), {which} tick: {'met' if met else 'NOT met'}"
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1k,10k", help=f"comma-separated, of {', '.join(CASES)} (default 1k,10k)")
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the pure pass (best of)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    stores = [kind.strip() for kind in args.stores.split(",") if kind.strip()]
    for size in sizes:
        if size not in CASES:
            parser.error(f"--sizes: unknown size {size!r}; accepted: {', '.join(CASES)}")
    for kind in stores:
        if kind not in ("sqlite", "postgresql"):
            parser.error(f"--stores: unknown store {kind!r}; accepted: sqlite, postgresql")
    env = environment()
    rows = []
    with tempfile.TemporaryDirectory(prefix="iris-tick-bench-") as tmp:
        for kind in stores:
            for size in sizes:
                rows.append(run_case(kind, CASES[size], args.seed, args.repeat, Path(tmp)))
                print(f"  {kind} {size}: tick {rows[-1].tick_s:.3f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"environment": env, "rows": [asdict(row) for row in rows]}, indent=2))
    else:
        print_table(rows, env)
    return 0 if all(row.identical for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

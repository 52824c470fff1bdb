"""Placement over many ticks, for the figures of issue 13: what holds cost and buy, and how far a
lagging peer is over-assigned.

Both scenarios drive the real pass (``placement_snapshot.place``) tick after tick on simulated time
(no clock, no I/O), each against a baseline measured in the same run:

- **stream**: a steady stream of small GPU jobs plus a few big ones, on peers whose backends each
  hold exactly one big job. The baseline has holding off (``reserve_after_ms`` None); the other run
  holds after ``--reserve-after`` seconds. It prints how long the big jobs wait (in ticks) in each,
  the small jobs' wait, and the fraction of GPU-ticks left idle (what holding costs: a held
  backend idles while it drains).
- **lagging**: peers that advertise the same free capacity on every heartbeat, each with a newer
  observation, while every job handed to them stays in their queue (a Kueue that admits nothing).
  The baseline is the reference's ledger (reset by each newer observation); the other run is this
  provider's reservations (held until the peer's reports show the job). It prints what each hands
  the peers per tick against what they offer.

Run through ``python -m bench.placement_bench`` (``--scenarios-only`` for these alone).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iris_airflow_provider.core.availability import Availability, PeerBackend, PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import Constraint, Op, normalize_advertised
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import Candidate, plan
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place
from iris_airflow_provider.core.reservations import InFlight

TICK_MS = 30_000
START_MS = 1_000_000_000
H100 = normalize_advertised({"device-type": ["gpu"], "device-variant": ["h100"]})
SHAPE = (Constraint("device-type", Op.EQ, ("gpu",)), Constraint("device-variant", Op.EQ, ("h100",)))


@dataclass
class Job:
    job_id: str
    gpus: int
    duration: int  # ticks it runs for
    arrived: int  # tick
    big: bool
    promoted: int | None = None


@dataclass
class StreamRun:
    reserve_after_s: int | None
    big_waits: list[int | None] = field(default_factory=list)  # ticks queued; None: never placed
    small_waits: list[int] = field(default_factory=list)
    unplaced_big_waits: list[int] = field(default_factory=list)  # ticks waited so far by those never placed
    idle_gpu_ticks: int = 0
    gpu_ticks: int = 0
    seconds: float = 0.0

    @property
    def idle_fraction(self) -> float:
        return self.idle_gpu_ticks / self.gpu_ticks if self.gpu_ticks else 0.0


def _workload(rng: random.Random, ticks: int, peers: int, big_every: int, load: float) -> list[Job]:
    """Small jobs (8 GPUs, 4-12 ticks) asking for ``load`` times the fleet on average, and a big one
    (32 GPUs, 10 ticks) every ``big_every`` ticks."""
    jobs = []
    slots = peers * 32 / 8  # small jobs the fleet runs at once
    rate = load * slots / 8  # arrivals per tick (mean duration 8 ticks)
    for tick in range(ticks):
        arrivals = int(rate) + (1 if rng.random() < rate - int(rate) else 0)
        for n in range(arrivals):
            jobs.append(Job(f"/stream/small-{tick:05d}-{n}", 8, rng.randint(4, 12), tick, big=False))
        if tick % big_every == big_every // 2:
            jobs.append(Job(f"/stream/big-{tick:05d}", 32, 10, tick, big=True))
    return jobs


def run_stream(
    *, seed: int, ticks: int, peers: int, big_every: int, load: float, reserve_after_s: int | None
) -> StreamRun:
    rng = random.Random(seed)
    arrivals = _workload(rng, ticks, peers, big_every, load)
    result = StreamRun(reserve_after_s)
    rules = PlacementRules(
        max_per_peer=8,
        staleness_ms=120_000,
        reserve_after_ms=None if reserve_after_s is None else reserve_after_s * 1000,
    )
    running: dict[str, list[tuple[int, int]]] = {f"p{i:02d}": [] for i in range(peers)}  # peer -> (gpus, ends)
    queue: list[Job] = []
    holds: dict[str, tuple[str, str]] = {}
    started = time.perf_counter()
    position = 0
    for tick in range(ticks):
        now = START_MS + tick * TICK_MS
        while position < len(arrivals) and arrivals[position].arrived <= tick:
            queue.append(arrivals[position])
            position += 1
        for peer_id in running:
            running[peer_id] = [(gpus, ends) for gpus, ends in running[peer_id] if ends > tick]
        states = []
        for peer_id, work in running.items():
            held = sum(gpus for gpus, _ in work)
            block = Availability(2, now, {"h100": 32 - held}, {"h100": 32}, {Band.INTERACTIVE: {"h100": held}})
            states.append(PeerState(peer_id, True, now, (PeerBackend("default", H100, block),), now))
        result.gpu_ticks += 32 * peers
        candidates = tuple(
            Candidate(
                job.job_id, Band.INTERACTIVE, START_MS + job.arrived * TICK_MS, shape=SHAPE, gate=(("h100", job.gpus),)
            )
            for job in queue
        )
        outcome = place(PlacementSnapshot(candidates, tuple(states), (), now, (), holds), rules)
        holds = {hold.job_id: hold.key for hold in outcome.holds}
        by_id = {job.job_id: job for job in queue}
        for promotion in outcome.promotions:
            job = by_id.pop(promotion.job_id)
            job.promoted = tick
            running[promotion.peer_id].append((job.gpus, tick + job.duration))
            (result.small_waits if not job.big else result.big_waits).append(tick - job.arrived)  # type: ignore[arg-type]
        queue = list(by_id.values())
        result.idle_gpu_ticks += sum(32 - sum(g for g, _ in work) for work in running.values())
    result.big_waits += [None for job in queue if job.big]
    result.unplaced_big_waits = sorted(ticks - job.arrived for job in queue if job.big)
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class LaggingRun:
    mode: str  # "reference ledger" or "reservations"
    promoted_per_tick: list[int]
    offered_gpus: int  # what the peers advertise free, per report
    handed_gpus: int  # what was handed to them over every tick
    seconds: float


def run_lagging(*, peers: int, queue: int, ticks: int, reference: bool) -> LaggingRun:
    """Peers advertising 8 free h100 on every heartbeat (a newer observation each tick) that never
    start what they are handed."""
    pending = [
        Candidate(f"/lag/job-{i:06d}", Band.INTERACTIVE, START_MS - queue + i, shape=SHAPE, gate=(("h100", 8),))
        for i in range(queue)
    ]
    ledger: tuple[LedgerEntry, ...] = ()
    in_flight: list[InFlight] = []
    per_tick = []
    handed = 0
    started = time.perf_counter()
    for tick in range(ticks):
        now = START_MS + tick * TICK_MS
        states = tuple(
            PeerState(
                f"p{i:02d}",
                True,
                now,
                (PeerBackend("default", H100, Availability(2, now, {"h100": 8}, {"h100": 64})),),
                now,
            )
            for i in range(peers)
        )
        if reference:  # the reference: spend the ledger of the last observation, reset by a newer one
            outcome = plan(pending, states, ledger, now_ms=now, max_per_peer=8, staleness_ms=120_000)
            ledger = outcome.ledger
        else:
            snapshot = PlacementSnapshot(tuple(pending), states, (), now, tuple(in_flight))
            outcome = place(snapshot, PlacementRules(max_per_peer=8, staleness_ms=120_000))
            in_flight += [InFlight(p.job_id, p.peer_id, p.backend_id, p.reserved) for p in outcome.promotions]
        done = {p.job_id for p in outcome.promotions}
        pending = [c for c in pending if c.job_id not in done]
        per_tick.append(len(outcome.promotions))
        handed += sum(sum(p.reserved.values()) for p in outcome.promotions)
    return LaggingRun(
        "reference ledger" if reference else "reservations",
        per_tick,
        offered_gpus=8 * peers,
        handed_gpus=handed,
        seconds=time.perf_counter() - started,
    )


def run_all(*, seed: int, ticks: int, peers: int, big_every: int, load: float, reserve_after_s: int) -> dict[str, Any]:
    shape = {"seed": seed, "ticks": ticks, "peers": peers, "big_every": big_every, "load": load}
    stream = [run_stream(**shape, reserve_after_s=None), run_stream(**shape, reserve_after_s=reserve_after_s)]
    lagging = [run_lagging(peers=50, queue=100_000, ticks=5, reference=reference) for reference in (True, False)]
    return {"stream": stream, "lagging": lagging}


def _stats(values: Sequence[int | None], unplaced: Sequence[int] = ()) -> str:
    placed = sorted(v for v in values if v is not None)
    text = f"median {placed[len(placed) // 2]}, max {placed[-1]} of {len(placed)}" if placed else "none placed"
    if unplaced:
        text += f"; {len(unplaced)} never, after {', '.join(map(str, unplaced[::-1]))}"
    return text


def print_scenarios(figures: dict[str, Any], *, ticks: int, peers: int, big_every: int, load: float) -> None:
    without, holding = figures["stream"]
    print(
        f"\nstream of small jobs plus a few big ones: {peers} peers x 32 h100, {ticks} ticks of {TICK_MS // 1000} s; "
        f"small jobs of 8 h100 for 4-12 ticks asking for {load:.0%} of the fleet, a 32-h100 job every {big_every} "
        "ticks; 'never': still queued at the end"
    )
    header = f"{'':>28} {'big jobs wait (ticks)':>56} {'small jobs wait (ticks)':>32} {'GPU idle':>9} {'time':>7}"
    print(header)
    print("-" * len(header))
    for run in (without, holding):
        label = "holding off (baseline)" if run.reserve_after_s is None else f"holding after {run.reserve_after_s} s"
        print(
            f"{label:>28} {_stats(run.big_waits, run.unplaced_big_waits):>56} {_stats(run.small_waits):>32} "
            f"{run.idle_fraction:8.1%} {run.seconds:6.2f}s"
        )
    cost = holding.idle_fraction - without.idle_fraction
    print(
        f"GPU-idle fraction holding costs: {cost:+.1%} of all GPU-ticks "
        f"({holding.idle_fraction:.1%} against {without.idle_fraction:.1%} without)"
    )

    reference, reserved = figures["lagging"]
    print(
        "\nlagging peers: 50 peers each advertising 8 free h100 on every heartbeat (a newer observation every "
        "tick) and starting nothing they are handed; 100,000 8-h100 jobs queued; 5 ticks"
    )
    for run in (reference, reserved):
        ratio = run.handed_gpus / run.offered_gpus
        print(
            f"{run.mode:>28}: promotions per tick {run.promoted_per_tick}; handed {run.handed_gpus} h100 for "
            f"{run.offered_gpus} offered ({ratio:.1f}x); {run.seconds:.2f} s for 5 passes"
        )
    print(
        f"over-assignment: {reference.handed_gpus / max(1, reserved.handed_gpus):.0f}x more with the reference ledger; "
        "with reservations it is bounded by one report's free capacity however many ticks pass"
    )


def as_json(figures: dict[str, Any]) -> dict[str, Any]:
    without, holding = figures["stream"]
    return {
        "stream": [
            {
                "reserve_after_s": run.reserve_after_s,
                "big_waits_ticks": [wait for wait in run.big_waits if wait is not None],
                "big_never_placed_waited_ticks": run.unplaced_big_waits,
                "small_wait_median_ticks": sorted(run.small_waits)[len(run.small_waits) // 2]
                if run.small_waits
                else None,
                "gpu_idle_fraction": run.idle_fraction,
            }
            for run in (without, holding)
        ],
        "idle_fraction_cost": holding.idle_fraction - without.idle_fraction,
        "lagging": [
            {
                "mode": run.mode,
                "promoted_per_tick": run.promoted_per_tick,
                "handed_gpus": run.handed_gpus,
                "offered_gpus": run.offered_gpus,
            }
            for run in figures["lagging"]
        ],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenarios-only", action="store_true", help="only the multi-tick capacity scenarios")
    parser.add_argument("--skip-scenarios", action="store_true", help="leave out the multi-tick capacity scenarios")
    parser.add_argument("--stream-ticks", type=int, default=2000, help="ticks of the stream scenario (default: 2000)")
    parser.add_argument("--stream-peers", type=int, default=4, help="peers of 32 h100 in the stream (default: 4)")
    parser.add_argument("--big-every", type=int, default=100, help="a big job every this many ticks (default: 100)")
    parser.add_argument(
        "--stream-load", type=float, default=1.1, help="small jobs' demand over the fleet's capacity (default: 1.1)"
    )
    parser.add_argument(
        "--reserve-after", type=int, default=1800, help="seconds a big job waits before it holds (default: 1800)"
    )


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run_all(
        seed=args.seed,
        ticks=args.stream_ticks,
        peers=args.stream_peers,
        big_every=args.big_every,
        load=args.stream_load,
        reserve_after_s=args.reserve_after,
    )


def print_from_args(figures: dict[str, Any], args: argparse.Namespace) -> None:
    print_scenarios(
        figures, ticks=args.stream_ticks, peers=args.stream_peers, big_every=args.big_every, load=args.stream_load
    )

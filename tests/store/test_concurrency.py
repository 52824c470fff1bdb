"""Processes promoting and cancelling the same jobs at once never corrupt the store.

Several real processes race over one database: promoters each try to promote every job to their
own peer, cancellers cancel a random half. The store must never promote a job twice, never
promote a cancelled job, and what the jobs in flight reserve must count exactly the confirmed
promotions.
"""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter

import pytest

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import Direction, HandoffState, JobState
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.store import FederationStore

JOBS = 200
PROMOTERS = 3
CANCELLERS = 2
EPOCH = 1_000


def _promoter(url: str, peer_id: str, seed: int, batch: int, barrier, results) -> None:
    store = FederationStore.from_url(url)
    order = [f"/u/job-{i}" for i in range(JOBS)]
    random.Random(seed).shuffle(order)
    promotions = [Promotion(job_id, peer_id, "b", False, {"h100": 1}, EPOCH) for job_id in order]
    barrier.wait()
    won = []
    for start in range(0, JOBS, batch):  # as a tick applies its pass: a batch of promotions at once
        won += [promotion.job_id for promotion in store.apply_promotions(promotions[start : start + batch], 5)]
    results.put((f"{peer_id}#{seed}", won))
    store.dispose()


def _canceller(url: str, seed: int, barrier, results) -> None:
    store = FederationStore.from_url(url)
    rng = random.Random(seed)
    order = rng.sample([f"/u/job-{i}" for i in range(JOBS)], JOBS // 2)
    barrier.wait()
    killed = [job_id for job_id in order if store.request_cancel(job_id, 6).killed]
    results.put(("cancel", killed))
    store.dispose()


@pytest.mark.parametrize("batch", [1, 40], ids=["one-by-one", "batched"])
def test_concurrent_promotions_and_cancels_never_double_promote_or_promote_a_cancelled_job(store, batch):
    url = store.url
    for i in range(JOBS):
        spec = parse_job(
            {"job_id": f"/u/job-{i}", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
        )
        store.admit(NewIncarnation(spec, direction=Direction.SENT, submitting_user="u@example.com"), now_ms=1)

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROMOTERS + CANCELLERS)
    results = context.Queue()
    # Two promoters share a peer, like two ticks that planned the same placement.
    workers = [
        context.Process(target=_promoter, args=(url, f"peer-{n % 2}", n, batch, barrier, results))
        for n in range(PROMOTERS)
    ]
    workers += [context.Process(target=_canceller, args=(url, 100 + n, barrier, results)) for n in range(CANCELLERS)]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0

    won = Counter(job_id for who, ids in reports if who != "cancel" for job_id in ids)
    assert all(count == 1 for count in won.values()), "a job was promoted twice"
    promoted_by = {job_id: who.split("#")[0] for who, ids in reports if who != "cancel" for job_id in ids}

    for i in range(JOBS):
        job_id = f"/u/job-{i}"
        job = store.get_job(job_id)
        kinds = [(e.kind, e.peer_id) for e in store.events(job_id)]
        promotions = [peer for kind, peer in kinds if kind == "promoted"]
        assert len(promotions) <= 1
        if job_id in promoted_by:
            assert promotions == [promoted_by[job_id]]
            assert (job.handoff_state, job.peer_id) == (HandoffState.PENDING, promoted_by[job_id])
            cancels = [n for n, (kind, _) in enumerate(kinds) if kind == "cancel_requested"]
            assert all(n > kinds.index(("promoted", promoted_by[job_id])) for n in cancels), "promoted after cancel"
        else:
            assert promotions == []
            assert job.handoff_state is HandoffState.QUEUED
            assert job.state is JobState.KILLED and job.cancel_requested

    # What is reserved on each peer counts exactly the confirmed promotions not cancelled since.
    per_peer = Counter(promoted_by.values())
    live = Counter(peer for job_id, peer in promoted_by.items() if not store.get_job(job_id).terminal)
    reserved: Counter[str] = Counter()
    for job in store.in_flight_handoffs():
        reserved[job.peer_id] += job.gate["h100"]
    assert reserved == live
    assert sum(per_peer.values()) + sum(1 for i in range(JOBS) if f"/u/job-{i}" not in promoted_by) == JOBS

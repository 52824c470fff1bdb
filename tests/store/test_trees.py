"""Job trees in the store: a child is admitted only under a live, uncancelled parent; a tree is
cancelled whole; and a cancel racing a child's submit never leaves a live, uncancelled child under a
cancelled parent (real processes, SQLite and PostgreSQL)."""

from __future__ import annotations

import multiprocessing

import pytest

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.store import FederationStore
from iris_airflow_provider.store.trees import ParentNotLiveError

ROOTS = 60


def _new(job_id: str) -> NewIncarnation:
    return NewIncarnation(parse_job({"job_id": job_id}), direction=Direction.LOCAL, submitting_user="u@example.com")


def test_a_child_is_admitted_under_a_live_parent_only(store: FederationStore) -> None:
    root = store.admit(_new("/u/root"), 1).job
    child = store.admit_child(_new("/u/root/a"), "/u/root", root.nonce, 2)
    assert child.created and child.job.job_id == "/u/root/a"
    again = store.admit_child(_new("/u/root/a"), "/u/root", root.nonce, 3)
    assert not again.created and again.job.nonce == child.job.nonce  # a live child: reattached
    with pytest.raises(ParentNotLiveError):
        store.admit_child(_new("/u/root/b"), "/u/root", "another-incarnation", 4)
    store.request_cancel("/u/root", 5)
    with pytest.raises(ParentNotLiveError, match="is being cancelled"):
        store.admit_child(_new("/u/root/b"), "/u/root", root.nonce, 6)
    assert store.get_job("/u/root/b") is None


def test_a_tree_is_cancelled_whole_and_only_below_its_root(store: FederationStore) -> None:
    root = store.admit(_new("/u/root"), 1).job
    other = store.admit(_new("/u/root2"), 1).job
    a = store.admit_child(_new("/u/root/a"), "/u/root", root.nonce, 2).job
    store.admit_child(_new("/u/root/a/x_1"), "/u/root/a", a.nonce, 3)
    store.admit_child(_new("/u/root2/a"), "/u/root2", other.nonce, 3)
    outcomes = store.request_cancel_tree("/u/root", 4)
    assert [key for key, _ in outcomes] == ["/u/root", "/u/root/a", "/u/root/a/x_1"]
    assert all(outcome.found and not outcome.was_terminal for _, outcome in outcomes)
    assert [job.job_id for job in store.tree("/u/root")] == ["/u/root/a", "/u/root/a/x_1"]
    assert not store.get_job("/u/root2").cancel_requested
    assert not store.get_job("/u/root2/a").cancel_requested
    assert {job.job_id for job in store.live_children()} == {"/u/root/a", "/u/root/a/x_1", "/u/root2/a"}


def _submitter(url: str, nonces: dict[str, str], barrier, results) -> None:
    store = FederationStore.from_url(url)
    barrier.wait()
    admitted = []
    for i in range(ROOTS):
        try:
            store.admit_child(_new(f"/u/root-{i}/child"), f"/u/root-{i}", nonces[f"/u/root-{i}"], 10)
            admitted.append(i)
        except ParentNotLiveError:
            pass
    results.put(("submitted", admitted))
    store.dispose()


def _canceller(url: str, barrier, results) -> None:
    store = FederationStore.from_url(url)
    barrier.wait()
    for i in range(ROOTS):
        store.request_cancel_tree(f"/u/root-{i}", 11)
    results.put(("cancelled", []))
    store.dispose()


def test_a_cancel_racing_a_child_submit_never_leaves_the_child_uncancelled(store: FederationStore) -> None:
    nonces = {f"/u/root-{i}": store.admit(_new(f"/u/root-{i}"), 1).job.nonce for i in range(ROOTS)}
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=_submitter, args=(store.url, nonces, barrier, results)),
        context.Process(target=_canceller, args=(store.url, barrier, results)),
    ]
    for process in processes:
        process.start()
    outcomes = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    admitted = outcomes["submitted"]
    for i in range(ROOTS):
        assert store.get_job(f"/u/root-{i}").cancel_requested
        child = store.get_job(f"/u/root-{i}/child")
        if i in admitted:
            assert child is not None and child.cancel_requested, f"child of root-{i} escaped its parent's cancel"
        else:
            assert child is None

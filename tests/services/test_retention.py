"""Bounded storage: the tick prunes finished jobs past the retention, in bounded batches, and never
a live job, a job whose task may still reattach, or an incarnation that ran again meanwhile."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services import retention
from iris_airflow_provider.services.retention import prune_finished
from iris_airflow_provider.store.records import Origin
from tests.services.world import ALICE, World, event_kinds, spec, tick_until

DAY_MS = 86_400_000


def finished(world: World, name: str, *, run: str = "manual__1") -> str:
    federation = world.federation()
    job_id = f"/alice/{name}"
    federation.submit(spec(job_id, f"echo {name}"), submitting_user=ALICE, origin=Origin("train", run, name))
    tick_until(federation, world.store, job_id, JobState.SUCCEEDED)
    return job_id


def states(**by_task: str) -> Any:
    """Airflow's answer for DAG ``train``: every run, each task in the state given."""

    def answer(dag_id: str, run_ids: list[str], task_ids: list[str]) -> Mapping[str, Mapping[str, Any]]:
        return {run_id: {task: state for task, state in by_task.items() if task in task_ids} for run_id in run_ids}

    return answer


def test_finished_jobs_past_the_retention_go_with_their_history_and_output(lite: World) -> None:
    old = finished(lite, "old")
    recent = finished(lite, "recent")
    live = lite.federation().submit(spec("/alice/live", lite.held("live")), submitting_user=ALICE).job
    assert live is not None
    # A day after the recent one ended: the old one ended before that day began (its end is when
    # its backend saw it end), the recent one did not.
    now = lite.store.get_job(recent).finished_at_ms + DAY_MS
    assert lite.store.get_job(old).finished_at_ms < now - DAY_MS

    pruned = prune_finished(lite.store, now, DAY_MS, states(old="success", recent="success"))
    assert pruned == [old]
    assert lite.store.get_job(old) is None and lite.store.events(old) == [] and lite.store.log_lines(old) == []
    assert lite.store.get_job(recent) is not None and "admitted" in event_kinds(lite.store, recent)
    assert lite.store.get_job("/alice/live") is not None  # not finished: never pruned, however old
    lite.release("live")


def test_a_job_whose_task_is_still_going_is_kept(lite: World) -> None:
    kept = finished(lite, "retrying")
    gone = finished(lite, "done")
    lite.clock.advance(2 * DAY_MS)
    assert prune_finished(lite.store, lite.clock(), DAY_MS, states(retrying="up_for_retry", done="success")) == [gone]
    assert lite.store.get_job(kept) is not None
    # Without Airflow's answer, nothing a task submitted is pruned.
    assert prune_finished(lite.store, lite.clock(), DAY_MS, None) == []
    assert prune_finished(lite.store, lite.clock(), DAY_MS, states(retrying="success")) == [kept]


def test_an_incarnation_run_again_after_it_was_judged_is_not_deleted(lite: World) -> None:
    job_id = finished(lite, "rerun")
    lite.clock.advance(2 * DAY_MS)
    [judged] = lite.store.finished_before(lite.clock() - DAY_MS, 10)
    federation = lite.federation()
    rerun = federation.submit(spec(job_id, "echo again"), submitting_user=ALICE, origin=Origin("train", "r2", "rerun"))
    assert rerun.job is not None
    assert lite.store.prune_jobs([(judged.job_id, judged.nonce)], lite.clock() - DAY_MS) == []
    assert lite.store.get_job(job_id) is not None


def test_each_tick_prunes_at_most_one_batch(lite: World, monkeypatch: Any) -> None:
    monkeypatch.setattr(retention, "PRUNE_BATCH", 2)
    ids = [finished(lite, f"j{n}") for n in range(3)]
    lite.clock.advance(2 * DAY_MS)
    answer = states(**{f"j{n}": "success" for n in range(3)})
    assert prune_finished(lite.store, lite.clock(), DAY_MS, answer) == ids[:2]
    assert prune_finished(lite.store, lite.clock(), DAY_MS, answer) == ids[2:]
    assert prune_finished(lite.store, lite.clock(), 0, answer) == []  # 0 keeps everything


def test_output_of_replaced_incarnations_goes_once_as_old(lite: World) -> None:
    job_id = finished(lite, "twice")
    first_nonce = lite.store.get_job(job_id).nonce
    federation = lite.federation()
    federation.submit(spec(job_id, "echo second"), submitting_user=ALICE, origin=Origin("train", "r2", "twice"))
    tick_until(federation, lite.store, job_id, JobState.SUCCEEDED)
    lite.clock.advance(2 * DAY_MS)
    assert lite.store.prune_superseded_output(lite.clock() - DAY_MS, 100) >= 1
    current = lite.store.get_job(job_id)
    assert current is not None and current.nonce != first_nonce
    lines = [line for _, line in lite.store.log_lines(job_id)]
    assert any("second" in line for line in lines) and not any("twice" in line for line in lines)

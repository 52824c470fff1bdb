"""The tick's writes in batches (expiries, promotions, delivery claims, handed-off marks, mirrored
reports, holds): one statement per batch, and still each row's own compare-and-set. A batch that
mixes rows whose condition holds with rows that moved on (cancelled, pinned elsewhere, another
incarnation, already ended) changes exactly the first, as the row-by-row writes did. Batches are
shrunk to two rows so every write spans several."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.holds import Hold
from iris_airflow_provider.core.job_report import JobReport
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store import common
from iris_airflow_provider.store.records import Admitted
from iris_airflow_provider.store.store import FederationStore
from tests.store.test_store import NOW, promotion, queue


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "BATCH", 2)


def kinds(store: FederationStore, job_id: str) -> list[str]:
    return [event.kind for event in store.events(job_id)]


def promoted(store: FederationStore, *job_ids: str) -> dict[str, str]:
    """Queue and promote each job to backend ``b-<its name>`` of ``cw``; their nonces."""
    for job_id in job_ids:
        queue(store, job_id)
    confirmed = store.apply_promotions([promotion(j, backend=f"b-{j[-1]}") for j in job_ids], NOW)
    assert [p.job_id for p in confirmed] == list(job_ids)
    return {job_id: store.get_job(job_id).nonce for job_id in job_ids}


def test_expiry_ends_only_the_jobs_still_queued_under_the_deadline_read(store):
    for name in "abcde":
        queue(store, f"/alice/{name}", scheduling_deadline_ms=NOW + 10)
    queue(store, "/alice/later", scheduling_deadline_ms=NOW + 1_000)
    assert store.promote(promotion("/alice/b"), NOW + 1)  # left the queue before the tick
    store.request_cancel("/alice/d", NOW + 2)  # ended by its cancel
    assert store.expire_queued(NOW + 50) == ["/alice/a", "/alice/c", "/alice/e"]
    for name in "ace":
        job = store.get_job(f"/alice/{name}")
        assert (job.state, job.error) == (JobState.UNSCHEDULABLE, reasons.SCHEDULING_TIMEOUT)
        assert kinds(store, f"/alice/{name}") == ["admitted", "expired"]
    assert store.get_job("/alice/b").handoff_state is HandoffState.PENDING
    assert "expired" not in kinds(store, "/alice/d")
    assert store.get_job("/alice/later").state is JobState.PENDING


def test_a_batch_of_promotions_applies_each_to_its_own_peer_and_backend_where_its_condition_holds(store):
    for name in "abcde":
        queue(store, f"/alice/{name}", pin="cw-2" if name in "cd" else "")
    store.request_cancel("/alice/b", NOW)
    store.save_holds([Hold("/alice/a", "cw-1", "x", {}, {}, 0), Hold("/alice/e", "cw-2", "y", {}, {}, 0)], NOW)
    assert set(store.capacity_holds()) == {"/alice/a", "/alice/e"}
    wanted = [
        promotion("/alice/a", peer="cw-1", backend="a100"),
        promotion("/alice/b", peer="cw-1", backend="h100"),  # cancelled: lost its race
        promotion("/alice/c", peer="cw-1", backend="h100"),  # pinned to cw-2: never elsewhere
        promotion("/alice/d", peer="cw-2", backend="h200"),
        promotion("/alice/e", peer="cw-3", backend=""),  # force-routed
    ]
    confirmed = store.apply_promotions(wanted, NOW + 1)
    assert [p.job_id for p in confirmed] == ["/alice/a", "/alice/d", "/alice/e"]
    placed = {
        job_id: (job.handoff_state, job.peer_id, job.backend_id)
        for job_id, job in store.get_jobs(f"/alice/{name}" for name in "abcde").items()
    }
    assert placed == {
        "/alice/a": (HandoffState.PENDING, "cw-1", "a100"),
        "/alice/b": (HandoffState.QUEUED, "", ""),
        "/alice/c": (HandoffState.QUEUED, "cw-2", ""),
        "/alice/d": (HandoffState.PENDING, "cw-2", "h200"),
        "/alice/e": (HandoffState.PENDING, "cw-3", ""),
    }
    assert [e.detail for e in store.events("/alice/e") if e.kind == "promoted"] == ["backend (force-routed)"]
    assert [kinds(store, f"/alice/{name}").count("promoted") for name in "abcde"] == [1, 0, 0, 1, 1]
    assert store.capacity_holds() == {}  # the promoted jobs' holds ended with their promotion
    assert store.apply_promotions(wanted, NOW + 2) == []  # already promoted: nothing twice


def test_holds_are_saved_only_for_jobs_still_queued(store):
    for name in "abc":
        queue(store, f"/alice/{name}")
    store.request_cancel("/alice/b", NOW)
    holds = [Hold(f"/alice/{name}", "cw", f"b-{name}", {}, {}, 0) for name in "abc"]
    assert store.save_holds(holds, NOW + 1) == {"/alice/a": ("cw", "b-a"), "/alice/c": ("cw", "b-c")}


def test_delivery_claims_in_one_batch_take_only_the_claimable(store):
    nonces = promoted(store, "/alice/a", "/alice/b", "/alice/c", "/alice/d")
    assert store.begin_delivery("/alice/b", nonces["/alice/b"], NOW, stale_before_ms=NOW - 1)  # held elsewhere
    store.request_cancel("/alice/c", NOW)
    incarnations = [(job_id, nonce) for job_id, nonce in nonces.items()]
    incarnations[3] = ("/alice/d", "an-older-nonce")
    assert store.begin_deliveries(incarnations, NOW + 1, stale_before_ms=NOW - 1) == {"/alice/a"}


def test_handed_off_marks_in_one_batch_are_each_judged_on_their_own_row(store):
    nonces = promoted(store, "/alice/a", "/alice/b", "/alice/c", "/alice/d", "/alice/e")
    claimed = store.begin_deliveries(list(nonces.items()), NOW, stale_before_ms=NOW - 1)
    assert claimed == set(nonces)
    store.request_cancel("/alice/b", NOW + 1)  # a cancel raced the delivery: re-armed once admitted
    assert store.mirror(JobReport("/alice/c", nonces["/alice/c"], JobState.PENDING, "b-c"), NOW + 1)  # report first
    admitted = [Admitted(job_id, nonce, "cw") for job_id, nonce in nonces.items()]
    admitted[3] = Admitted("/alice/d", "an-older-nonce", "cw")  # another incarnation: abandoned there
    assert store.mark_handed_off_many(admitted, NOW + 2) == {"/alice/a", "/alice/b", "/alice/e"}
    for job_id in ("/alice/a", "/alice/b", "/alice/e"):
        job = store.get_job(job_id)
        assert (job.handoff_state, job.handed_off_at_ms, job.delivery_claimed_at_ms) == (
            HandoffState.HANDED_OFF,
            NOW + 2,
            None,
        )
        assert kinds(store, job_id).count("handed_off") == 1
    assert store.get_job("/alice/b").cancel_delivered_version == 0  # re-armed for the re-drive
    assert store.get_job("/alice/d").handoff_state is HandoffState.PENDING
    assert [(h.job_id, h.nonce) for h in store.abandoned_handoffs()] == [("/alice/d", "an-older-nonce")]
    assert "handed_off" not in kinds(store, "/alice/c")  # its report handed it off already


def test_reports_mirrored_in_one_batch_keep_each_job_its_own_backend_start_and_incarnation(store):
    nonces = promoted(store, "/alice/a", "/alice/b", "/alice/c", "/alice/d", "/alice/e")
    store.request_cancel("/alice/e", NOW)  # a pending handoff: ends at once, reports are ignored after
    reports = [
        JobReport("/alice/a", nonces["/alice/a"], JobState.RUNNING, "node-a", started_at_ms=NOW + 1),
        JobReport("/alice/b", nonces["/alice/b"], JobState.RUNNING, "node-b", started_at_ms=NOW + 2),
        JobReport("/alice/c", "an-older-nonce", JobState.RUNNING, "node-c", started_at_ms=NOW + 3),
        JobReport("/alice/d", nonces["/alice/d"], JobState.SUCCEEDED, "node-d", exit_code=0, result='{"ok": 1}'),
        JobReport("/alice/e", nonces["/alice/e"], JobState.RUNNING, "node-e", started_at_ms=NOW + 5),
    ]
    assert store.mirror_many(reports, NOW + 10) == {"/alice/a", "/alice/b", "/alice/d"}
    jobs = store.get_jobs(nonces)
    seen = {j: (job.state, job.handoff_state, job.backend_id, job.started_at_ms) for j, job in jobs.items()}
    assert seen["/alice/a"] == (JobState.RUNNING, HandoffState.HANDED_OFF, "node-a", NOW + 1)
    assert seen["/alice/b"] == (JobState.RUNNING, HandoffState.HANDED_OFF, "node-b", NOW + 2)
    assert seen["/alice/c"] == (JobState.PENDING, HandoffState.PENDING, "b-c", None)
    assert seen["/alice/d"][:3] == (JobState.SUCCEEDED, HandoffState.HANDED_OFF, "node-d")
    assert store.get_job("/alice/e").state is JobState.KILLED
    assert store.mirror_many(reports[:2], NOW + 11) == set()  # nothing new: nothing written
    assert [kinds(store, f"/alice/{name}").count("reported") for name in "abcde"] == [1, 1, 0, 1, 0]
    with pytest.raises(ValueError, match="distinct jobs"):
        store.mirror_many([reports[0], reports[0]], NOW + 12)

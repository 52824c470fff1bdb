"""The peer side on a real store and a real process backend: who may hand a job over, idempotency by
(requester, nonce), incarnations, requester-scoped sync, terminate and logs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.services import receiver as receiver_module
from iris_airflow_provider.store.store import FederationStore
from tests.receiving_peer import Peer, stop_all_jobs

KEY = "marin:/alice/train"  # where the peer keeps marin's /alice/train


@pytest.fixture
def peer(tmp_path: Path, store: FederationStore) -> Iterator[Peer]:
    peer = Peer(tmp_path, store)
    yield peer
    stop_all_jobs(peer)


def refused(call: Any, code: PeerErrorCode) -> str:
    with pytest.raises(PeerError) as caught:
        call()
    assert caught.value.code is code, caught.value
    return caught.value.message


def test_a_handoff_is_admitted_under_the_parents_id_started_here_and_recorded_as_a_run(peer: Peer) -> None:
    answer = peer.handoff()
    assert not answer.replay and answer.job.nonce == "n1"
    job = peer.store.get_job(KEY)
    assert (job.direction, job.peer_id, job.submitting_user, job.backend_id) == (
        Direction.RECEIVED,
        "marin",
        "alice@example.com",
        "default",
    )
    assert peer.runs == [(KEY, "n1")]
    assert answer.job.state in (JobState.RUNNING, JobState.SUCCEEDED)  # it started at once
    assert peer.wait_until_finished().state is JobState.SUCCEEDED


def test_the_same_nonce_again_is_a_replay_of_the_same_job(peer: Peer) -> None:
    peer.handoff()
    again = peer.handoff()
    assert again.replay and again.job.nonce == "n1"
    kinds = [e.kind for e in peer.store.events(KEY)]
    assert kinds.count("admitted") == 1 and "replayed" in kinds
    assert peer.runs == [(KEY, "n1")]


def test_a_new_nonce_is_refused_while_the_job_runs_and_becomes_a_new_incarnation_after(peer: Peer) -> None:
    peer.handoff(spec={"command": "sleep 30", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}})
    message = refused(lambda: peer.handoff("n2"), PeerErrorCode.ALREADY_EXISTS)
    assert "still running here" in message
    peer.receiver.terminate("marin", "/alice/train")
    peer.wait_until_finished()
    answer = peer.handoff("n2")
    assert not answer.replay and peer.store.get_job(KEY).nonce == "n2"
    assert peer.runs == [(KEY, "n1"), (KEY, "n2")]


def test_each_requester_has_its_own_namespace_so_ids_never_meet_and_nothing_is_disclosed(peer: Peer) -> None:
    """A peer cannot squat another's job id (or this cluster's), nor learn which ids exist: the same
    id from another requester is simply another job, in that requester's namespace."""
    peer.handoff()
    other = peer.handoff("n9", caller="other", requester="other")
    assert not other.replay and other.job.job_id == "/alice/train"  # reported under the id it sent
    assert {(j.job_id, j.peer_id) for j in peer.store.list_jobs(limit=10)} == {
        (KEY, "marin"),
        ("other:/alice/train", "other"),
    }
    assert peer.store.get_job("/alice/train") is None  # and this cluster's own id stays free
    assert peer.runs == [(KEY, "n1"), ("other:/alice/train", "n9")]
    peer.wait_until_finished()
    peer.wait_until_finished("other:/alice/train")


@pytest.mark.parametrize(
    ("overrides", "code", "message"),
    [
        ({"requester": "someone-else"}, PeerErrorCode.PERMISSION_DENIED, "does not match the authenticated peer"),
        ({"submitting_user": ""}, PeerErrorCode.PERMISSION_DENIED, "accountable submitter"),
        ({"submitting_user": "local_admin"}, PeerErrorCode.PERMISSION_DENIED, "accountable submitter"),
        ({"submitting_user": "mallory@evil.example"}, PeerErrorCode.PERMISSION_DENIED, "is not admitted"),
        ({"job_id": "/alice/train/child"}, PeerErrorCode.INVALID_ARGUMENT, "must be a root job"),
        (
            {"spec": {"resources": {"device": {"type": "gpu", "variant": "h100", "count": 0}}}},
            PeerErrorCode.INVALID_ARGUMENT,
            "spec.resources.device.count: must be >= 1",
        ),
        (
            {"spec": {"resources": {"device": {"type": "gpu", "variant": "gb200", "count": 1}}}},
            PeerErrorCode.INVALID_ARGUMENT,
            "no backend of cluster cw-east can host",
        ),
    ],
)
def test_refused_handoffs_say_why_and_leave_nothing_behind(
    peer: Peer, overrides: dict[str, Any], code: PeerErrorCode, message: str
) -> None:
    assert message in refused(lambda: peer.handoff(**overrides), code)
    assert peer.store.list_jobs(limit=10) == [] and peer.runs == []


def test_allowed_submitters_match_exact_names_and_domains_in_any_case(peer: Peer) -> None:
    peer.handoff("n-a", submitting_user="Bob@EXAMPLE.com", job_id="/bob/a")
    peer.handoff("n-b", submitting_user="ops-bot", job_id="/ops/b")
    refused(lambda: peer.handoff("n-c", submitting_user="ops-bot2", job_id="/ops/c"), PeerErrorCode.PERMISSION_DENIED)


def test_a_nonce_reused_for_another_job_is_refused_and_writes_nothing(peer: Peer) -> None:
    peer.handoff("n1", job_id="/alice/a")
    message = refused(lambda: peer.handoff("n1", job_id="/alice/b"), PeerErrorCode.INVALID_ARGUMENT)
    assert "'n1'" in message and "fresh nonce" in message
    assert peer.store.get_job("marin:/alice/b") is None and peer.runs == [("marin:/alice/a", "n1")]


def test_a_run_that_cannot_be_created_yet_makes_the_parent_retry_and_the_retry_creates_it(peer: Peer) -> None:
    peer.run_failures = 1
    refused(lambda: peer.handoff(), PeerErrorCode.UNAVAILABLE)
    assert peer.runs == []
    assert peer.handoff().replay  # the job was kept; the replay creates the run
    assert peer.runs == [(KEY, "n1")]


def test_sync_reports_only_the_callers_jobs_with_a_full_snapshot_for_a_stale_cursor(peer: Peer) -> None:
    peer.handoff()
    peer.handoff(caller="other", requester="other", job_id="/carol/x")
    first = peer.receiver.sync("marin", "")
    assert first.cursor_stale and [d.job_id for d in first.deltas] == ["/alice/train"]
    peer.wait_until_finished()
    later = peer.receiver.sync("marin", first.next_cursor)
    assert not later.cursor_stale
    (delta,) = [d for d in later.deltas if d.job_id == "/alice/train"]
    assert (delta.state, delta.exit_code) == (JobState.SUCCEEDED, 0)
    assert [(r.index, r.state, r.exit_code) for r in delta.replicas] == [(0, JobState.SUCCEEDED, 0)]
    assert all(d.job_id != "/carol/x" for d in later.deltas)
    reset = peer.receiver.sync("marin", str(int(later.next_cursor) + 1000))  # the parent is ahead: this store was reset
    assert reset.cursor_stale


def test_terminate_cancels_a_running_job_re_reports_a_finished_one_and_knows_only_the_callers(peer: Peer) -> None:
    peer.handoff(spec={"command": "sleep 30", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}})
    peer.receiver.terminate("marin", "/alice/train")
    assert peer.wait_until_finished().state is JobState.KILLED
    before = len(peer.store.events(KEY))
    peer.receiver.terminate("marin", "/alice/train")  # finished: re-reported so a stuck mirror converges
    assert peer.store.events(KEY)[-1].kind == "rereported" and len(peer.store.events(KEY)) > before
    assert "not found" in refused(lambda: peer.receiver.terminate("other", "/alice/train"), PeerErrorCode.NOT_FOUND)
    refused(lambda: peer.receiver.logs("other", "/alice/train", "", 10), PeerErrorCode.NOT_FOUND)


def test_logs_are_the_jobs_output_and_a_cursor_returns_only_new_lines(peer: Peer) -> None:
    peer.handoff(
        spec={"command": "echo one; echo two", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
    )
    peer.wait_until_finished()
    first = peer.receiver.logs("marin", "/alice/train", "", 1)
    assert first.lines == ["[replica 0] one"] and first.truncated
    rest = peer.receiver.logs("marin", "/alice/train", first.next_cursor, 10)
    assert rest.lines == ["[replica 0] two"]


def test_a_job_larger_than_any_backend_here_is_sent_back_for_another_peer(peer: Peer) -> None:
    big = {"command": "true", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 4}, "replicas": 4}}
    message = refused(lambda: peer.handoff(spec=big), PeerErrorCode.RESOURCE_EXHAUSTED)
    assert message == "no backend of cluster cw-east is large enough for job /alice/train (needs 16 h100)"
    assert peer.store.list_jobs(limit=10) == [] and peer.runs == []


def test_terminate_with_a_nonce_stops_only_that_incarnation(peer: Peer) -> None:
    peer.handoff(spec={"command": "sleep 30", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}})
    refused(lambda: peer.receiver.terminate("marin", "/alice/train", "n0"), PeerErrorCode.NOT_FOUND)
    assert not peer.store.get_job(KEY).cancel_requested
    peer.receiver.terminate("marin", "/alice/train", "n1")
    assert peer.wait_until_finished().state is JobState.KILLED


def test_a_parent_far_behind_catches_up_over_several_syncs_without_losing_a_job(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_module, "SYNC_LIMIT", 2)
    monkeypatch.setattr(receiver_module, "SYNC_OVERLAP", 0)  # the overlap is far below the real limit
    for name in ("a", "b", "c"):
        peer.handoff(f"n-{name}", job_id=f"/alice/{name}")
    first = peer.receiver.sync("marin", "0")
    assert [d.job_id for d in first.deltas] == ["/alice/a", "/alice/b"]
    assert int(first.next_cursor) < peer.store.latest_event_seq()  # not past what it left out
    second = peer.receiver.sync("marin", first.next_cursor)
    assert "/alice/c" in [d.job_id for d in second.deltas]


def test_a_finished_jobs_result_travels_in_every_answer_that_reports_it(peer: Peer) -> None:
    """The parent may lose any answer: a replayed handoff, a sync from the start and a terminate of
    the finished job each carry the result this cluster's store kept for the incarnation."""
    writes = """echo trained; printf '{"loss": 0.5}' > "$IRIS_RESULT\""""
    spec = {"command": writes, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
    peer.handoff(spec=spec)
    job = peer.wait_until_finished()
    assert job.state is JobState.SUCCEEDED
    assert peer.store.job_result(KEY, "n1") == '{"loss": 0.5}'
    replay = peer.handoff(
        spec={"command": writes, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}}
    )
    assert replay.replay and replay.job.result == '{"loss": 0.5}'
    (delta,) = peer.receiver.sync("marin", "").deltas
    assert (delta.state, delta.result) == (JobState.SUCCEEDED, '{"loss": 0.5}')
    assert peer.receiver.terminate("marin", "/alice/train").result == '{"loss": 0.5}'
    # Another requester's view of the same id holds nothing of it.
    assert peer.receiver.sync("rogue", "").deltas == []


@pytest.mark.parametrize("cursor", ["0", ""], ids=["from-a-cursor", "full-snapshot"])
def test_a_sync_answer_carries_results_up_to_its_budget_and_the_rest_follow(
    peer: Peer, monkeypatch: pytest.MonkeyPatch, cursor: str
) -> None:
    monkeypatch.setattr(receiver_module, "SYNC_OVERLAP", 0)
    monkeypatch.setattr(receiver_module, "SYNC_RESULTS_BUDGET", 25)  # two 12-character results
    for name in ("a", "b", "c"):
        peer.handoff(
            f"n-{name}",
            job_id=f"/alice/{name}",
            spec={"command": f"""printf '{{"job": "{name}"}}' > "$IRIS_RESULT\"""", "resources": {}},
        )
        peer.wait_until_finished(f"marin:/alice/{name}")
    seen: dict[str, str | None] = {}
    for _ in range(5):
        answer = peer.receiver.sync("marin", cursor)
        assert sum(len(d.result or "") for d in answer.deltas) <= 25 and not answer.cursor_stale
        seen |= {d.job_id: d.result for d in answer.deltas}
        if answer.next_cursor == cursor:
            break
        cursor = answer.next_cursor
    assert seen == {f"/alice/{name}": f'{{"job": "{name}"}}' for name in ("a", "b", "c")}

"""A handed-off root's tree on the peer that runs it, mirrored back as part of the root: the peer
reports the root's children (states, exit codes) with the root's status and serves their output to
the requester alone; the parent keeps them on the root, relays their output into the root's, and
its task log says how each child ends. A cancel of the root from the parent cancels the tree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from iris_airflow_provider.backends.base import LogChunk
from iris_airflow_provider.cluster.build import build_local_backends
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.job_report import ChildReport
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.wire import HandoffRequest, JobStatus
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_tokens import JobTokens
from iris_airflow_provider.services.receiver import Receiver
from iris_airflow_provider.store.records import NewIncarnation
from iris_airflow_provider.store.store import FederationStore
from tests.services.world import ALICE, FakePeer, World, spec
from tests.waiting import wait_for

ROOT = "marin:/alice/coordinator"


@pytest.fixture
def peer(tmp_path: Path, sqlite_store: FederationStore):
    config = parse_cluster_config(
        {
            "name": "cw-east",
            "state_dir": str(tmp_path / "state"),
            "federation": {"allowed_submitters": ["alice@example.com"]},
            "backends": [{"id": "cpu", "kind": "process", "max_running_jobs": 6}],
        }
    )
    tokens = JobTokens("cw-east", b"k" * 32, federation_url="http://cw-east.invalid")
    federation = Federation(config, sqlite_store, backends=build_local_backends(config), peers={}, job_tokens=tokens)
    receiver = Receiver(federation, start_run=lambda job: None)
    gate = tmp_path / "gate"
    request = {
        "job_id": "/alice/coordinator",
        "nonce": "n1",
        "requester": "marin",
        "owner_principal": "alice@example.com",
        "submitting_user": "alice@example.com",
        "submitted_at_ms": 1,
        "backend_id": "cpu",
        "spec": {"command": f"while [ ! -e {gate} ]; do sleep 0.02; done"},
    }
    receiver.handoff("marin", HandoffRequest.model_validate(request))
    yield federation, receiver, tokens, gate
    for backend in federation.backends.values():
        for job_id in backend.live_job_ids():  # type: ignore[attr-defined]
            backend.cancel(job_id)


def _tick_until(federation: Federation, key: str, state: JobState) -> None:
    def reached() -> bool:
        federation.tick()
        job = federation.store.get_job(key)
        return job is not None and job.state is state

    wait_for(reached, f"{key} {state.value}", timeout=20)


def test_the_peer_reports_a_roots_children_with_it_and_serves_their_output_to_the_requester_alone(peer) -> None:
    federation, receiver, tokens, _ = peer
    children = federation.children
    caller = children.caller(f"Bearer {tokens.mint(ROOT, 'n1')}")
    assert caller.direction is Direction.RECEIVED
    children.submit(caller, {"job_id": "shard-0", "command": "echo zero"})
    children.submit(caller, {"job_id": "shard-1", "command": "echo one; exit 4"})
    child = federation.store.get_job(f"{ROOT}/shard-0")
    assert child.direction is Direction.LOCAL and child.submitting_user == "alice@example.com"
    _tick_until(federation, f"{ROOT}/shard-0", JobState.SUCCEEDED)
    _tick_until(federation, f"{ROOT}/shard-1", JobState.FAILED)

    (delta,) = [d for d in receiver.sync("marin", "").deltas if d.job_id == "/alice/coordinator"]
    assert {(c.job_id, c.state, c.exit_code) for c in delta.children} == {
        ("/alice/coordinator/shard-0", JobState.SUCCEEDED, 0),
        ("/alice/coordinator/shard-1", JobState.FAILED, 4),
    }
    # A change of a child alone is reported as its root's, with the whole tree (not as a job of its own).
    cursor = receiver.sync("marin", "").next_cursor
    children.submit(caller, {"job_id": "shard-2", "command": "true"})
    later = receiver.sync("marin", cursor).deltas
    assert [d.job_id for d in later] == ["/alice/coordinator"]
    assert len(later[0].children) == 3
    # Output per child, to the requester that handed the root over, and to nobody else.
    assert receiver.logs("marin", "/alice/coordinator/shard-0", "", 100).lines == ["[replica 0] zero"]
    with pytest.raises(PeerError) as refused:
        receiver.logs("other", "/alice/coordinator/shard-0", "", 100)
    assert refused.value.code is PeerErrorCode.NOT_FOUND
    # The wire shape is compatible both ways: a status without children still parses, as None.
    assert JobStatus.model_validate({"job_id": "/a/b", "nonce": "n", "state": "running"}).children is None
    assert (
        JobStatus.model_validate_json(delta.model_dump_json())
        .to_report()
        .children[0]
        .job_id.startswith("/alice/coordinator/")
    )

    # The parent's terminate of the root cancels the tree here.
    children.submit(caller, {"job_id": "long", "command": "sleep 60"})
    receiver.terminate("marin", "/alice/coordinator")
    assert federation.store.get_job(f"{ROOT}/long").cancel_requested
    _tick_until(federation, f"{ROOT}/long", JobState.KILLED)


def test_the_parent_keeps_the_reported_tree_on_the_root_with_its_output_and_says_so_in_the_task_log(
    sqlite_store: FederationStore,
) -> None:
    store = sqlite_store
    spec = parse_job({"job_id": "/alice/coordinator", "target_cluster": "cw-east"})
    root = store.admit(NewIncarnation(spec, direction=Direction.SENT, submitting_user="alice"), 1).job
    running = (
        ChildReport("/alice/coordinator/a", JobState.RUNNING),
        ChildReport("/alice/coordinator/b", JobState.RUNNING),
    )
    assert store.mirror_children(root.job_id, root.nonce, running, 2)
    assert not store.mirror_children(root.job_id, root.nonce, running, 3)  # nothing new
    assert not store.mirror_children(root.job_id, "another-incarnation", running, 3)
    assert store.append_child_logs(root.job_id, root.nonce, "/alice/coordinator/a", ["[replica 0] hi"], "c1", 4)
    ended = (
        ChildReport("/alice/coordinator/a", JobState.SUCCEEDED, 0),
        ChildReport("/alice/coordinator/b", JobState.FAILED, 4, "Replica 0 exited with code 4"),
    )
    assert store.mirror_children(root.job_id, root.nonce, ended, 5)
    job = store.get_job(root.job_id)
    assert [(c["job_id"], c["state"], c["exit_code"], c["log_cursor"]) for c in job.children] == [
        ("/alice/coordinator/a", "succeeded", 0, "c1"),  # where relaying its output got to is kept
        ("/alice/coordinator/b", "failed", 4, ""),
    ]
    lines = [line for _, line in store.log_lines(root.job_id)]
    assert "[/alice/coordinator/a] [replica 0] hi" in lines
    assert "[iris-federation] child /alice/coordinator/b: failed (exit code 4)" in lines
    assert "children" in [e.kind for e in store.events(root.job_id)]


class TreePeer(FakePeer):
    """A peer on which a root's whole tree runs between two of the parent's syncs: the first report
    the parent gets has the root ended, naming its children for the first time; it serves their output."""

    def __init__(self, peer_id: str, clock: Callable[[], int]) -> None:
        super().__init__(peer_id, clock)
        self.child_output: dict[str, tuple[str, ...]] = {}

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        return LogChunk((), "end") if cursor == "end" else LogChunk(self.child_output.get(job_id, ()), "end")


def test_a_tree_that_ran_wholly_between_two_syncs_still_has_its_childrens_output_relayed(
    world_with: Callable[..., World],
) -> None:
    world = world_with()
    peer = TreePeer("cw-fake", world.clock)
    federation = world.federation({"cw-fake": peer})
    federation.submit(spec("/alice/coordinator", "coordinate", h100=1), submitting_user=ALICE)
    assert federation.tick().delivered == ["/alice/coordinator"]
    children = (
        ChildReport("/alice/coordinator/a", JobState.SUCCEEDED, 0),
        ChildReport("/alice/coordinator/b", JobState.FAILED, 4),
    )
    peer.child_output = {
        "/alice/coordinator/a": ("[replica 0] from a",),
        "/alice/coordinator/b": ("[replica 0] from b",),
    }
    ended = replace(peer.jobs["/alice/coordinator"], state=JobState.SUCCEEDED, exit_code=0, children=children)
    peer.jobs["/alice/coordinator"] = ended
    federation.tick()
    root = world.job("/alice/coordinator")
    assert root.state is JobState.SUCCEEDED and [c["job_id"] for c in root.children] == [c.job_id for c in children]
    lines = [line for _, line in world.store.log_lines(root.job_id)]
    # Each child's output, then how it ended, as when the tree is seen running.
    assert lines.index("[/alice/coordinator/a] [replica 0] from a") < lines.index(
        "[iris-federation] child /alice/coordinator/a: succeeded (exit code 0)"
    )
    assert lines.index("[/alice/coordinator/b] [replica 0] from b") < lines.index(
        "[iris-federation] child /alice/coordinator/b: failed (exit code 4)"
    )

"""Job trees on one cluster (real process backend, real store): a running job submits children with
its job token, they inherit what the rules say, a tree is cancelled whole, a child never outlives
its parent, and a token acts on its own tree only."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.router import Disposition
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.children import ChildJobs, NotInTreeError
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_tokens import JobTokenError, JobTokens
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.trees import ParentNotLiveError
from tests.services.world import ALICE, World, event_kinds, spec, tick_until
from tests.waiting import wait_for

KEY = b"job-token-key-of-marin-for-tests!"
URL = "http://127.0.0.1:18080"


class Seconds:
    """The tokens' clock, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def federation(world: World, clock: Seconds | None = None) -> tuple[Federation, ChildJobs, JobTokens]:
    tokens = JobTokens("marin", KEY, federation_url=URL, clock=clock or time.time)
    fed = Federation(
        world.config,
        world.store,
        backends=world.backends,
        peers=world.peers,
        clock=world.clock,
        jitter=world.jitter,
        job_tokens=tokens,
    )
    assert fed.children is not None
    return fed, fed.children, tokens


def bearer(token: str) -> str:
    return f"Bearer {token}"


def start_root(world: World, fed: Federation, name: str = "coordinator") -> JobRecord:
    """A root job of alice's that runs here, writes what it was given to call back, and waits."""
    out = world.tmp_path / f"{name}.env"
    command = (
        f'echo "$IRIS_FEDERATION_URL $IRIS_JOB_TOKEN_FILE $IRIS_JOB_TOKEN" > {out}.tmp && mv {out}.tmp {out}; '
        + world.held(name)
    )
    root = spec(f"/alice/{name}", command, env={"WANDB_PROJECT": "llm", "SHARED": "root"})
    submitted = fed.submit(root, submitting_user=ALICE)
    assert submitted.decision.disposition is Disposition.LOCAL
    wait_for(lambda: out.exists() and out.read_text().strip(), f"{name} to write its env")
    return world.job(f"/alice/{name}")


def token_of(world: World, name: str = "coordinator") -> tuple[str, Path, str]:
    url, token_file, token = (world.tmp_path / f"{name}.env").read_text().split()
    return url, Path(token_file), token


def test_a_job_gets_its_clusters_url_and_a_token_that_authenticates_it(lite: World) -> None:
    fed, children, _ = federation(lite)
    root = start_root(lite, fed)
    url, token_file, token = token_of(lite)
    assert url == URL
    assert token_file.read_text() == token
    assert children.caller(bearer(token)).job_id == root.job_id


def test_the_tick_renews_a_running_jobs_token_file(lite: World) -> None:
    clock = Seconds()
    fed, children, _ = federation(lite, clock)
    root = start_root(lite, fed)
    _, token_file, first = token_of(lite)
    clock.now += 600  # later than half the token's life
    fed.tick()
    renewed = token_file.read_text()
    assert renewed != first
    assert (
        jwt.decode(renewed, options={"verify_signature": False})["exp"]
        > jwt.decode(first, options={"verify_signature": False})["exp"]
    )
    assert children.caller(bearer(renewed)).job_id == root.job_id


def test_a_child_inherits_env_runs_here_and_is_submitted_as_the_roots_user(lite: World) -> None:
    fed, children, _ = federation(lite)
    root = start_root(lite, fed)
    caller = children.caller(bearer(token_of(lite)[2]))
    out = lite.tmp_path / "child.out"
    submitted = children.submit(
        caller,
        {
            "job_id": "prep",
            "command": f'echo "$WANDB_PROJECT $SHARED $IRIS_JOB_ID" > {out}',
            "env": {"SHARED": "child"},
        },
    )
    assert submitted.job is not None and submitted.decision.disposition is Disposition.LOCAL
    child = tick_until(fed, lite.store, "/alice/coordinator/prep", JobState.SUCCEEDED)
    assert out.read_text().split() == ["llm", "child", "/alice/coordinator/prep"]
    assert child.submitting_user == root.submitting_user == ALICE
    assert child.job_spec.inferred_parent == "/alice/coordinator"
    # The parent's task log (its relayed output) says how its child ended.
    lines = [line for _, line in lite.store.log_lines(root.job_id)]
    assert "[iris-federation] child /alice/coordinator/prep: succeeded (exit code 0)" in lines
    # Submitting the same child again while it is live reattaches; once finished, runs it again.
    again = children.submit(caller, {"job_id": "prep", "command": "true"})
    assert again.job is not None and again.job.nonce != child.nonce


def test_a_child_that_would_route_to_a_peer_is_refused_naming_target_cluster(lite: World) -> None:
    fed, children, _ = federation(lite)
    start_root(lite, fed)
    caller = children.caller(bearer(token_of(lite)[2]))
    refused = children.submit(
        caller,
        {"job_id": "train", "command": "true", "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}},
    )
    assert refused.job is None and refused.decision.disposition is Disposition.REJECT
    assert "Set target_cluster on the root job /alice/coordinator" in refused.decision.reason
    pinned = children.submit(caller, {"job_id": "train", "command": "true", "target_cluster": "cw-h100"})
    assert pinned.job is None and "only whole root jobs federate" in pinned.decision.reason
    assert lite.store.get_job("/alice/coordinator/train") is None


def test_a_bad_child_names_the_field(lite: World) -> None:
    fed, children, _ = federation(lite)
    start_root(lite, fed)
    caller = children.caller(bearer(token_of(lite)[2]))
    with pytest.raises(SpecError) as error:
        children.submit(caller, {"job_id": "a/b", "command": "true"})
    assert error.value.problems[0].path == "job_id"
    with pytest.raises(SpecError) as error:
        children.submit(caller, {"job_id": "x", "resources": {"replicas": 0}})
    assert error.value.problems[0].path == "resources.replicas"


def _tree(lite: World, fed: Federation, children: ChildJobs) -> tuple[JobRecord, JobRecord]:
    """coordinator -> worker -> shard, all running; returns (worker, shard) callers."""
    start_root(lite, fed)
    root_caller = children.caller(bearer(token_of(lite)[2]))
    worker_out = lite.tmp_path / "worker.env"
    command = f'echo "$IRIS_FEDERATION_URL $IRIS_JOB_TOKEN_FILE $IRIS_JOB_TOKEN" > {worker_out}; ' + lite.held("w")
    children.submit(root_caller, {"job_id": "worker", "command": command})
    wait_for(lambda: worker_out.exists() and worker_out.read_text().strip(), "the worker's env")
    worker_caller = children.caller(bearer(token_of(lite, "worker")[2]))
    children.submit(worker_caller, {"job_id": "shard", "command": lite.held("s")})
    children.submit(root_caller, {"job_id": "sibling", "command": lite.held("sib")})
    return worker_caller, children.child(root_caller, "sibling")


def test_cancelling_the_root_cancels_its_whole_tree(lite: World) -> None:
    fed, children, _ = federation(lite)
    _tree(lite, fed, children)
    fed.cancel("/alice/coordinator")
    for job_id in ("/alice/coordinator/worker/shard", "/alice/coordinator/worker", "/alice/coordinator/sibling"):
        assert lite.job(job_id).cancel_requested
        assert "tree_cancelled" in event_kinds(lite.store, job_id)
    for job_id in ("/alice/coordinator", "/alice/coordinator/worker", "/alice/coordinator/worker/shard"):
        assert tick_until(fed, lite.store, job_id, JobState.KILLED).state is JobState.KILLED


def test_a_child_outliving_its_parent_is_killed(lite: World) -> None:
    fed, children, _ = federation(lite)
    _tree(lite, fed, children)
    lite.release("coordinator")  # the root succeeds while its children still run
    tick_until(fed, lite.store, "/alice/coordinator", JobState.SUCCEEDED)
    for job_id in ("/alice/coordinator/worker", "/alice/coordinator/worker/shard", "/alice/coordinator/sibling"):
        killed = tick_until(fed, lite.store, job_id, JobState.KILLED)
        assert killed.state is JobState.KILLED
    assert "orphaned" in event_kinds(lite.store, "/alice/coordinator/worker")
    details = [e.detail for e in lite.store.events("/alice/coordinator/worker") if e.kind == "orphaned"]
    assert "Its parent job /alice/coordinator ended (succeeded)" in details[0]


def test_a_token_acts_on_its_own_tree_only(lite: World) -> None:
    fed, children, _ = federation(lite)
    worker_caller, sibling = _tree(lite, fed, children)
    assert children.child(worker_caller, "shard").job_id == "/alice/coordinator/worker/shard"
    with pytest.raises(NotInTreeError):
        children.cancel(worker_caller, sibling.job_id)  # another job's token cancelling a sibling's tree
    with pytest.raises(NotInTreeError):
        children.cancel(worker_caller, "/alice/coordinator")  # nor its parent
    with pytest.raises(NotInTreeError):
        children.child(worker_caller, "/alice/coordinator/worker")  # nor itself
    assert not lite.job(sibling.job_id).cancel_requested
    answer = children.cancel(worker_caller, "shard")
    assert answer.result == "cancel_requested"


def test_bad_expired_foreign_and_finished_tokens_are_refused(lite: World) -> None:
    clock = Seconds()
    fed, children, tokens = federation(lite, clock)
    root = start_root(lite, fed)
    with pytest.raises(JobTokenError, match="Authorization: Bearer"):
        children.caller(None)
    with pytest.raises(JobTokenError, match="not a job token of this cluster"):
        children.caller(bearer("not-a-token"))
    forged = JobTokens("marin", b"another-key-another-key-another-k", federation_url=URL).mint(root.job_id, root.nonce)
    with pytest.raises(JobTokenError, match="Signature verification failed"):
        children.caller(bearer(forged))
    foreign = JobTokens("cw-east", KEY, federation_url=URL).mint(root.job_id, root.nonce)
    with pytest.raises(JobTokenError, match="not issued by this cluster"):
        children.caller(bearer(foreign))
    old = tokens.mint(root.job_id, root.nonce)
    clock.now += 3600
    with pytest.raises(JobTokenError, match="expired"):
        children.caller(bearer(old))
    lite.release("coordinator")
    tick_until(fed, lite.store, root.job_id, JobState.SUCCEEDED)
    with pytest.raises(JobTokenError, match="has ended"):
        children.caller(bearer(tokens.mint(root.job_id, root.nonce)))
    with pytest.raises(JobTokenError, match="was replaced"):
        children.caller(bearer(tokens.mint(root.job_id, "another-nonce")))


def test_a_cancelled_parent_takes_no_children(lite: World) -> None:
    fed, children, _ = federation(lite)
    start_root(lite, fed)
    caller = children.caller(bearer(token_of(lite)[2]))
    fed.cancel("/alice/coordinator")
    with pytest.raises(ParentNotLiveError, match="cannot submit children"):
        children.submit(caller, {"job_id": "late", "command": "true"})
    assert lite.store.get_job("/alice/coordinator/late") is None

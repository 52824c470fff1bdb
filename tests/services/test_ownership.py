"""Job ownership at the service: a job id belongs to the DAG, task and user that created it. Only
they reattach to it or run it again; anyone else is refused before anything is written, and is
told nothing about the job behind the id."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.ownership import OwnershipError
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.services.job_views import job_details
from iris_airflow_provider.services.submit import IdentityError
from iris_airflow_provider.store.records import NewIncarnation, Origin
from tests.services.world import ALICE, World, event_kinds, spec, tick_until

VICTIM = Origin("train_alice", "manual__1", "fit")
MALLORY = "mallory@example.com"
TAKEN = "job_id /alice/model is already used by another DAG, task or user; give this job another job_id"


def claims() -> list[tuple[Origin, str]]:
    """Every way of naming alice's job that is not alice's DAG and task: another DAG, another task,
    another user from alice's very DAG and task."""
    return [
        (Origin("mallory_dag", "manual__9", "fit"), MALLORY),
        (Origin("mallory_dag", "manual__9", "fit"), ALICE),  # same user, another DAG
        (Origin("train_alice", "manual__9", "evaluate"), ALICE),  # same DAG, another task
        (Origin("train_alice", "manual__9", "fit"), MALLORY),  # same DAG and task, another user
    ]


@pytest.mark.parametrize("claim", range(4))
def test_only_the_owner_reattaches_to_a_live_job(lite: World, claim: int) -> None:
    federation = lite.federation()
    job = spec("/alice/model", lite.held("model", before="echo secret output"))
    first = federation.submit(job, submitting_user=ALICE, origin=VICTIM)
    assert first.job is not None and first.job.direction is Direction.LOCAL
    before = (lite.store.get_job("/alice/model"), event_kinds(lite.store, "/alice/model"))

    origin, user = claims()[claim]
    with pytest.raises(OwnershipError) as refused:
        federation.submit(job, submitting_user=user, origin=origin)
    assert str(refused.value) == TAKEN  # the conflict, and nothing about the job: no state, owner or peer
    assert (lite.store.get_job("/alice/model"), event_kinds(lite.store, "/alice/model")) == before

    # The owner's next run of the same task (a retry, a cleared task, a new DAG run) reattaches.
    again = federation.submit(job, submitting_user=ALICE, origin=Origin("train_alice", "manual__2", "fit"))
    assert again.reattached and again.job is not None and again.job.nonce == first.job.nonce
    lite.release("model")


@pytest.mark.parametrize("claim", range(4))
def test_only_the_owner_runs_a_finished_job_again(lite: World, claim: int) -> None:
    federation = lite.federation()
    job = spec("/alice/model", "echo secret output")
    first = federation.submit(job, submitting_user=ALICE, origin=VICTIM)
    assert first.job is not None
    done = tick_until(federation, lite.store, "/alice/model", JobState.SUCCEEDED)
    history = event_kinds(lite.store, "/alice/model")

    origin, user = claims()[claim]
    with pytest.raises(OwnershipError, match="already used by another DAG, task or user"):
        federation.submit(job, submitting_user=user, origin=origin)
    assert lite.store.get_job("/alice/model") == done and event_kinds(lite.store, "/alice/model") == history

    rerun = federation.submit(job, submitting_user=ALICE, origin=Origin("train_alice", "manual__2", "fit"))
    assert rerun.job is not None and not rerun.reattached and rerun.job.nonce != first.job.nonce


def test_the_store_reincarnates_only_for_the_owner_whatever_the_caller_checked(lite: World) -> None:
    """The compare-and-set holds even for a caller that skipped the service's check (or raced it)."""
    federation = lite.federation()
    job = spec("/alice/model", "true")
    federation.submit(job, submitting_user=ALICE, origin=VICTIM)
    done = tick_until(federation, lite.store, "/alice/model", JobState.SUCCEEDED)
    for origin, user in claims():
        stranger = NewIncarnation(job, direction=Direction.LOCAL, submitting_user=user, origin=origin)
        assert lite.store.reincarnate(stranger, lite.clock()) is None
    assert lite.store.get_job("/alice/model") == done
    owner = NewIncarnation(job, direction=Direction.LOCAL, submitting_user=ALICE, origin=VICTIM)
    rerun = lite.store.reincarnate(owner, lite.clock())
    assert rerun is not None and rerun.nonce != done.nonce


def test_a_received_job_is_never_reincarnated_as_a_local_one(lite: World) -> None:
    federation = lite.federation()
    job = spec("/alice/model", "true")
    received = NewIncarnation(
        job, direction=Direction.RECEIVED, submitting_user=ALICE, peer_id="cw", key="cw:/alice/model"
    )
    assert lite.store.admit(received, lite.clock()).created
    lite.store.transition("cw:/alice/model", to_state=JobState.SUCCEEDED, now_ms=lite.clock())
    as_local = NewIncarnation(job, direction=Direction.LOCAL, submitting_user=ALICE, key="cw:/alice/model")
    assert lite.store.reincarnate(as_local, lite.clock()) is None
    other_peer = NewIncarnation(
        job, direction=Direction.RECEIVED, submitting_user=ALICE, peer_id="other", key="cw:/alice/model"
    )
    assert lite.store.reincarnate(other_peer, lite.clock()) is None
    assert federation.store.get_job("/alice/model") is None  # its key is the peer's namespace, not the job id


def test_a_job_document_shows_only_its_current_incarnation(lite: World) -> None:
    """A rerun starts a clean page: the earlier run's events and output are not part of it."""
    federation = lite.federation()
    job = spec("/alice/model", "echo first run output")
    federation.submit(job, submitting_user=ALICE, origin=VICTIM)
    first = tick_until(federation, lite.store, "/alice/model", JobState.SUCCEEDED)
    assert "[replica 0] first run output" in job_details(federation, first, lite.clock())["output_tail"]

    rerun = federation.submit(spec("/alice/model", "echo second run"), submitting_user=ALICE, origin=VICTIM)
    assert rerun.job is not None
    details = job_details(federation, rerun.job, lite.clock())
    kinds = [e["kind"] for e in details["events"]]
    assert kinds[0] == "resubmitted" and "admitted" not in kinds  # the first run's history is not shown
    assert all("first run" not in line for line in details["output_tail"]) and details["nonce"] == rerun.job.nonce
    done = tick_until(federation, lite.store, "/alice/model", JobState.SUCCEEDED)
    tail = job_details(federation, done, lite.clock())["output_tail"]
    assert "[replica 0] second run" in tail and all("first run" not in line for line in tail)


def test_an_agentless_peer_admits_only_its_allowed_submitters(world: World) -> None:
    """The admission an Airflow peer applies to itself, applied by the parent for a peer with no agent."""
    federation = world.federation()
    job = spec("/mallory/train", h100=1)
    federation.submit(job, submitting_user=MALLORY.replace("example.com", "evil.example"), origin=VICTIM)
    rejected = tick_until(federation, world.store, "/mallory/train", JobState.KILLED)
    assert rejected.error == (
        "Peer cw-h100 rejected the handoff: Submitter 'mallory@evil.example' is not admitted for federation to "
        "this cluster (allowed_submitters of peer cw-h100 in the cluster file)"
    )
    assert world.peer_backend("cw-h100").status("/mallory/train") is None  # nothing reached its backend


def test_an_explicit_submitter_needs_the_cluster_files_leave_for_the_dag(lite: World) -> None:
    federation = lite.federation()
    with pytest.raises(IdentityError, match=r"submitter 'ml-platform@example\.com' is not allowed for DAG 'etl'"):
        federation.check_service_principal("ml-platform@example.com", "etl")

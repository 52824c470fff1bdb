"""The rules of a child job: its id, where it runs, what it inherits, and when it must die."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.availability import LocalBackend, PeerBackend, PeerState
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.job_tree import (
    child_job_id,
    child_spec,
    child_submitter,
    is_descendant,
    orphan_reason,
    parent_key,
    root_key,
)
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.router import Disposition, classify
from iris_airflow_provider.core.states import JobState

PARENT = parse_job(
    {
        "job_id": "/alice/coordinator",
        "command": "python coordinate.py",
        "env": {"WANDB_PROJECT": "llm", "SHARED": "parent"},
        "regions": ["us-east"],
    }
)


def test_a_child_id_names_its_parent() -> None:
    assert child_job_id("/alice/coordinator", "train") == "/alice/coordinator/train"
    assert child_job_id("/alice/coordinator", "/alice/coordinator/train") == "/alice/coordinator/train"
    assert child_spec(PARENT, {"job_id": "train"}).inferred_parent == "/alice/coordinator"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a/b", "one segment"),
        ("", "one segment"),
        ("/alice/other/train", "one level below the job submitting it"),
        ("/alice/coordinator/x/y", "one level below"),
        ("..", "'..'"),
        ("bad name", "U+0020"),
    ],
)
def test_a_child_id_elsewhere_is_refused_naming_the_field(name: str, says: str) -> None:
    with pytest.raises(SpecError) as error:
        child_spec(PARENT, {"job_id": name})
    assert error.value.problems[0].path == "job_id"
    assert says in error.value.problems[0].message


def test_a_child_names_no_parent_itself() -> None:
    with pytest.raises(SpecError, match="parent_job_id"):
        child_spec(PARENT, {"job_id": "train", "parent_job_id": "/alice/coordinator"})


def test_keys_of_local_and_received_trees() -> None:
    assert parent_key("/alice/coordinator") is None
    assert parent_key("/alice/coordinator/train") == "/alice/coordinator"
    assert parent_key("/alice/coordinator/train/shard-0") == "/alice/coordinator/train"
    # A peer keeps a received root under <requester>:<job id>; its children under the same prefix.
    assert parent_key("marin:/alice/coordinator") is None
    assert parent_key("marin:/alice/coordinator/train") == "marin:/alice/coordinator"
    assert parent_key("marin:/alice/a:b") is None  # a ':' inside a segment is no namespace
    assert parent_key("marin:/alice/a:/b") == "marin:/alice/a:"
    assert root_key("marin:/alice/coordinator/train/shard-0") == "marin:/alice/coordinator"
    assert root_key("/alice/coordinator") == "/alice/coordinator"
    assert is_descendant("/alice/coordinator/train/x", "/alice/coordinator")
    assert not is_descendant("/alice/coordinator2/train", "/alice/coordinator")
    assert not is_descendant("/alice/coordinator", "/alice/coordinator")


def test_env_is_inherited_and_the_childs_own_wins() -> None:
    child = child_spec(PARENT, {"job_id": "train", "env": {"SHARED": "child", "OWN": "1"}})
    assert child.env == {"WANDB_PROJECT": "llm", "SHARED": "child", "OWN": "1"}
    assert PARENT.env["SHARED"] == "parent"


def test_a_merged_env_is_still_checked() -> None:
    with pytest.raises(SpecError) as error:
        child_spec(PARENT, {"job_id": "train", "env": {"IRIS_JOB_ID": "spoof"}})
    assert error.value.problems[0].path.startswith("env")


def test_region_is_inherited_unless_the_child_names_one() -> None:
    assert child_spec(PARENT, {"job_id": "a"}).regions == ("us-east",)
    assert child_spec(PARENT, {"job_id": "b", "regions": ["eu-west"]}).regions == ("eu-west",)
    own_constraint = child_spec(PARENT, {"job_id": "c", "constraints": [{"key": "region", "op": "EQ", "value": "x"}]})
    assert own_constraint.regions is None
    assert [c.values for c in own_constraint.routing if c.key == "region"] == [("x",)]


def test_a_parents_region_constraint_is_inherited_as_a_constraint() -> None:
    parent = parse_job(
        {"job_id": "/alice/p", "constraints": [{"key": "region", "op": "IN", "values": ["us-east", "us-west"]}]}
    )
    child = child_spec(parent, {"job_id": "a", "constraints": [{"key": "zone", "op": "EQ", "value": "z1"}]})
    assert {c.key: c.values for c in child.routing if c.key in ("region", "zone")} == {
        "region": ("us-east", "us-west"),
        "zone": ("z1",),
    }


def test_any_region_suppresses_the_inheritance_and_is_dropped() -> None:
    child = child_spec(PARENT, {"job_id": "gpu", "regions": ["*"]})
    assert child.regions is None
    assert not [c for c in child.routing if c.key == "region"]
    assert "regions" not in child.model_dump(exclude_none=True)
    # and nothing gives it one later: the cluster's default region only goes to jobs naming none
    assert child.with_default_region("us-central").regions == ("us-central",)  # (why the service skips it)


def test_a_parent_without_region_gives_none() -> None:
    parent = parse_job({"job_id": "/alice/p", "regions": ["*"]})
    assert child_spec(parent, {"job_id": "a"}).regions is None


def test_the_submitter_is_the_roots_accountable_user() -> None:
    assert child_submitter("alice@example.com", "") == ("alice@example.com", "alice@example.com")
    assert child_submitter("alice@example.com", "ml-platform@example.com") == (
        "alice@example.com",
        "ml-platform@example.com",
    )


def _peer_with_h100() -> PeerState:
    return PeerState(
        "cw-h100", True, 1_000, (PeerBackend("default", {"device-type": ("gpu",), "device-variant": ("h100",)}),)
    )


def test_a_child_never_federates() -> None:
    local = [LocalBackend("cpu", {"device-type": ("cpu",)}, None)]
    gpu_child = child_spec(
        PARENT,
        {"job_id": "train", "regions": ["*"], "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}}},
    )
    decision = classify(gpu_child, local_backends=local, peers=[_peer_with_h100()], now_ms=1_000, staleness_ms=60_000)
    assert decision.disposition is Disposition.REJECT
    assert "target_cluster on the root job /alice/coordinator" in decision.reason
    pinned = child_spec(PARENT, {"job_id": "pinned", "target_cluster": "cw-h100"})
    decision = classify(pinned, local_backends=local, peers=[_peer_with_h100()], now_ms=1_000, staleness_ms=60_000)
    assert decision.disposition is Disposition.REJECT
    assert "only whole root jobs federate" in decision.reason
    cpu_child = child_spec(PARENT, {"job_id": "prep", "regions": ["*"]})
    decision = classify(cpu_child, local_backends=local, peers=[_peer_with_h100()], now_ms=1_000, staleness_ms=60_000)
    assert decision.disposition is Disposition.LOCAL


@pytest.mark.parametrize(
    ("state", "cancel_requested", "says"),
    [
        (None, False, "no longer exists"),
        (JobState.SUCCEEDED, False, "ended (succeeded)"),
        (JobState.FAILED, False, "ended (failed)"),
        (JobState.KILLED, True, "ended (killed)"),
        (JobState.RUNNING, True, "was cancelled"),
    ],
)
def test_a_child_outliving_its_parent_must_die(state: JobState | None, cancel_requested: bool, says: str) -> None:
    reason = orphan_reason("/alice/p", state, cancel_requested=cancel_requested)
    assert reason is not None and says in reason and "/alice/p" in reason


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.ACCEPTED, JobState.RUNNING])
def test_a_live_parent_keeps_its_children(state: JobState) -> None:
    assert orphan_reason("/alice/p", state, cancel_requested=False) is None

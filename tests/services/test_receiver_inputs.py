"""Issue 11 at a receiving cluster (a real store, a real process backend): a hostile handoff is
refused naming the field, and nothing is written, started or recorded for it; the job id it used
stays free for a valid handoff."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.store.store import FederationStore
from tests.receiving_peer import Peer, stop_all_jobs

GPU = {"device": {"type": "gpu", "variant": "h100", "count": 1}}


@pytest.fixture
def peer(tmp_path: Path, store: FederationStore) -> Iterator[Peer]:
    peer = Peer(tmp_path, store)
    yield peer
    stop_all_jobs(peer)


def nothing_was_made(peer: Peer) -> bool:
    backend = peer.federation.backends["default"]
    return peer.store.list_jobs() == [] and backend.live_job_ids() == [] and peer.runs == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"files": {"a": "x", "a/b": "y"}}, "spec.files", "'a' is a file and a directory of 'a/b'"),
        ({"files": {".": "x"}}, "spec.files", "must not have empty, '.' or '..' segments"),
        ({"resources": {**GPU, "replicas": 10**9}}, "spec.resources.replicas", "between 1 and 4096"),
        ({"resources": {**GPU, "memory": float("inf")}}, "spec.resources.memory", "bytes per replica"),
        ({"resources": {**GPU, "cpu": "inf"}}, "spec.resources.cpu", "cores per replica"),
        ({"scheduling_deadline_ms": 1e30}, "spec.scheduling_deadline_ms", "before 2100-01-01"),
        ({"env": {"IRIS_JOB_NONCE": "mine"}}, "spec.env", "reserved"),
        # A NUL anywhere in a handoff is refused earlier, by the wire model (tests/peers/test_peer_api.py).
    ],
)
def test_a_hostile_spec_is_refused_naming_the_field_and_nothing_is_made(
    peer: Peer, spec: dict[str, Any], field: str, message: str
) -> None:
    body = {"command": "echo trained", "resources": GPU, **spec}
    with pytest.raises(PeerError) as caught:
        peer.handoff(spec=body)
    assert caught.value.code is PeerErrorCode.INVALID_ARGUMENT
    assert caught.value.message.startswith(f"{field}: ") and message in caught.value.message, caught.value.message
    assert nothing_was_made(peer)


def test_after_a_refused_handoff_the_job_id_takes_a_valid_one(peer: Peer) -> None:
    # Issue 11: colliding file names were a 500 that left the id wedged on the process backend.
    with pytest.raises(PeerError):
        peer.handoff(spec={"command": "true", "resources": GPU, "files": {"a": "x", "a/b": "y"}})
    peer.handoff("n2", spec={"command": "cat a/b", "resources": GPU, "files": {"a/b": "valid\n"}})
    assert peer.wait_until_finished().state is JobState.SUCCEEDED


@pytest.mark.parametrize("job_id", ["/../..", "/alice/./train", "/alice/train\x00", "/alice/" + "x" * 600])
def test_a_job_id_the_rule_refuses_never_reaches_the_receiver(peer: Peer, job_id: str) -> None:
    # Issue 11: '/../..' was admitted and started, then its run could not be created (Airflow
    # refuses '..' in run ids) and the parent retried for ever while the job ran unseen.
    with pytest.raises(ValidationError, match="must look like /<user>/<name>"):
        peer.handoff(job_id=job_id)
    assert nothing_was_made(peer)

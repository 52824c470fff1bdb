"""Serving URLs of a job handed to a peer: the peer reports where it serves the job's ports (minted
there, never by the parent) in its sync answer; the parent keeps only its own relay for that peer or
the peer's own api-server, for ports the job declares, written with the state they came with."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from iris_airflow_provider.cluster.build import build_local_backends
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.base import Peer, SyncResult
from iris_airflow_provider.peers.wire import HandoffRequest
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.receiver import Receiver
from iris_airflow_provider.services.serving import Serving
from iris_airflow_provider.store.store import FederationStore
from tests.services.world import ScriptedPeer, World, spec, tick_until

PARENT = "https://marin.example.com"
PEER_URL = "https://cw-h100.example.com"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJwb3J0IjoiaHR0cCJ9.c2ln"
RELAYED = f"{PARENT}/proxy/t/cluster=cw-h100/{TOKEN}/http/"
DIRECT = f"{PEER_URL}/proxy/t/{TOKEN}/metrics/"
PHISHING = "https://marin-example.evil.example/proxy/t/cluster=cw-h100/x/http/"


class ServingPeer(ScriptedPeer):
    """A peer reachable at PEER_URL whose sync says its running jobs serve at ``urls`` (what it says
    is scripted: an honest peer or a lying one)."""

    def __init__(self, inner: Peer, urls: dict[str, str]) -> None:
        super().__init__(inner)
        self.address = PEER_URL
        self.urls = urls

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        result = super().sync(job_ids, cursor)
        reports = {
            job_id: replace(report, serving_urls=self.urls) if report.state is JobState.RUNNING else report
            for job_id, report in result.reports.items()
        }
        return replace(result, reports=reports)


def parent(world: World, urls: dict[str, str]) -> Federation:
    peers = dict(world.peers, **{"cw-h100": ServingPeer(world.real_peers["cw-h100"], urls)})
    return Federation(
        world.config, world.store, backends=world.backends, peers=peers, clock=world.clock, own_url=PARENT
    )


def serve(world: World, federation: Federation, job_id: str = "/alice/llm") -> None:
    job = spec(job_id, world.held(job_id.rsplit("/", 1)[-1]), h100=1, ports=[{"name": "http"}, {"name": "metrics"}])
    federation.submit(job, submitting_user="alice@example.com")
    tick_until(federation, world.store, job_id, JobState.RUNNING)


def test_the_peers_urls_are_kept_at_the_parents_relay_or_the_peer_and_cleared_when_the_job_ends(world):
    federation = parent(world, {"http": RELAYED, "metrics": DIRECT})
    serve(world, federation)
    # The state and the URLs may come in separate answers: the next tick has them at the latest.
    job = tick_until(federation, world.store, "/alice/llm", JobState.RUNNING)
    assert job.serving_urls == {"http": RELAYED, "metrics": DIRECT}
    world.release("llm")
    done = tick_until(federation, world.store, "/alice/llm", JobState.SUCCEEDED)
    assert done.serving_urls is None


def test_a_lying_peers_urls_are_dropped_with_a_warning_naming_it(world, caplog):
    urls = {"http": PHISHING, "metrics": f"{PARENT}/proxy/t/cluster=cw-gb200/{TOKEN}/metrics/"}
    federation = parent(world, urls)
    caplog.set_level(logging.WARNING, logger="iris_airflow_provider.services.mirror")
    serve(world, federation)
    federation.tick()
    assert world.job("/alice/llm").serving_urls is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "iris_airflow_provider.services.mirror"]
    assert any("Peer cw-h100" in w and "/alice/llm" in w and "port 'http'" in w for w in warnings), warnings
    assert any("Peer cw-h100" in w and "port 'metrics'" in w for w in warnings), warnings
    assert not any(PHISHING in w for w in warnings)  # the link itself is never repeated


def test_a_port_the_job_does_not_declare_is_dropped_and_the_rest_kept(world):
    federation = parent(world, {"http": RELAYED, "admin": f"{PARENT}/proxy/t/cluster=cw-h100/{TOKEN}/admin/"})
    serve(world, federation)
    assert tick_until(federation, world.store, "/alice/llm", JobState.RUNNING).serving_urls == {"http": RELAYED}


# The peer's side: it reports what it mints for a received job while it runs there -----------------


@pytest.fixture
def receiving(tmp_path: Path, sqlite_store: FederationStore):
    config = parse_cluster_config(
        {
            "name": "cw-east",
            "state_dir": str(tmp_path / "state"),
            "federation": {"allowed_submitters": ["alice@example.com"], "public_parent": PARENT},
            "backends": [{"id": "cpu", "kind": "process", "max_running_jobs": 4}],
        }
    )
    federation = Federation(config, sqlite_store, backends=build_local_backends(config), peers={})
    serving = Serving(
        cluster="cw-east",
        secret=b"s" * 32,
        own_url="http://cw-east.internal",
        public_parent=PARENT,
        backends=federation.backends,
    )
    receiver = Receiver(federation, start_run=lambda job: None, serving_urls=serving.urls)
    yield federation, receiver, tmp_path / "gate"
    for backend in federation.backends.values():
        for job_id in backend.live_job_ids():  # type: ignore[attr-defined]
            backend.cancel(job_id)


def hand(receiver: Receiver, job_id: str, gate: Path, **spec_fields: object) -> None:
    request = {
        "job_id": job_id,
        "nonce": f"n-{job_id}",
        "requester": "marin",
        "submitting_user": "alice@example.com",
        "backend_id": "cpu",
        "spec": {"command": f"while [ ! -e {gate} ]; do sleep 0.02; done", **spec_fields},
    }
    receiver.handoff("marin", HandoffRequest.model_validate(request))


def test_the_peer_reports_the_urls_it_minted_while_the_job_runs_there(receiving):
    federation, receiver, gate = receiving
    hand(receiver, "/alice/llm", gate, ports=[{"name": "http"}])
    hand(receiver, "/alice/batch", gate)
    [llm] = [d for d in receiver.sync("marin", "").deltas if d.job_id == "/alice/llm"]
    if llm.state is not JobState.RUNNING:
        assert llm.serving_urls == {}  # it has ports, and serves nothing yet
    tick_until(federation, federation.store, "marin:/alice/llm", JobState.RUNNING)
    deltas = {d.job_id: d for d in receiver.sync("marin", "").deltas}
    [(port, url)] = deltas["/alice/llm"].serving_urls.items()
    assert port == "http" and url.startswith(f"{PARENT}/proxy/t/cluster=cw-east/ey") and url.endswith("/http/")
    assert deltas["/alice/batch"].serving_urls is None  # no ports: nothing to report
    gate.touch()
    tick_until(federation, federation.store, "marin:/alice/llm", JobState.SUCCEEDED)
    assert {d.job_id: d for d in receiver.sync("marin", "").deltas}["/alice/llm"].serving_urls == {}


def test_a_peer_that_mints_nothing_reports_nothing(receiving):
    federation, receiver, gate = receiving
    silent = Receiver(federation, start_run=lambda job: None)
    hand(receiver, "/alice/llm", gate, ports=[{"name": "http"}])
    tick_until(federation, federation.store, "marin:/alice/llm", JobState.RUNNING)
    assert [d.serving_urls for d in silent.sync("marin", "").deltas] == [None]
    gate.touch()

"""The world of the service tests: a cluster ``marin`` with agentless peers on real process backends,
a test-driven clock, and scripted or fake peers for when a peer must fail, hang, refuse or forget."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from iris_airflow_provider.backends.base import JobReport, LogChunk, now_ms
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.cluster.build import build_local_backends, build_peers
from iris_airflow_provider.cluster.config import ClusterConfig, parse_cluster_config
from iris_airflow_provider.core.availability import Availability, PeerBackend
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.base import Handoff, Peer, PeerError, PeerErrorCode, SyncResult, Termination
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.store import FederationStore

ALICE = "alice@example.com"
HANG_LIMIT = 10.0  # a hanging fake peer answers after this long at most, so no thread outlives the run


class Clock:
    """The federation's clock: real time when created, then moved only by the test."""

    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Jitter:
    """Jitter draws, in order; the last one repeats."""

    def __init__(self, *values: float) -> None:
        self.values = list(values) or [1.0]

    def __call__(self) -> float:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


class ScriptedPeer:
    """A real peer behind a script: per method, raise an error instead of answering, or hang first."""

    def __init__(self, inner: Peer) -> None:
        self.inner = inner
        self.peer_id = inner.peer_id
        self.kind = inner.kind
        self.address = inner.address
        self.errors: dict[str, BaseException] = {}
        self.lost_answers: dict[str, BaseException] = {}  # per method: do the call, then fail as if unheard
        self.hangs: dict[str, threading.Event] = {}
        self.calls: list[tuple[str, str]] = []
        self.handoffs: list[Handoff] = []

    def _before(self, method: str, argument: str = "") -> None:
        self.calls.append((method, argument))
        gate = self.hangs.get(method)
        if gate is not None:
            gate.wait(HANG_LIMIT)
        error = self.errors.get(method)
        if error is not None:
            raise error

    def count(self, method: str) -> int:
        return sum(1 for called, _ in self.calls if called == method)

    def hang(self, method: str) -> threading.Event:
        gate = self.hangs[method] = threading.Event()
        return gate

    def heartbeat(self) -> list[PeerBackend]:
        self._before("heartbeat")
        return self.inner.heartbeat()

    def deliver(self, handoff: Handoff) -> JobReport:
        self._before("deliver", handoff.job_id)
        self.handoffs.append(handoff)
        report = self.inner.deliver(handoff)
        if "deliver" in self.lost_answers:
            raise self.lost_answers["deliver"]
        return report

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        self._before("sync", ",".join(job_ids))
        return self.inner.sync(job_ids, cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        self._before("cancel", job_id)
        return self.inner.cancel(job_id, nonce)

    def terminate(self, job_id: str, nonce: str) -> Termination:
        self._before("terminate", job_id)
        return self.inner.terminate(job_id, nonce)

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        self._before("logs", job_id)
        return self.inner.logs(job_id, cursor, max_lines)

    def go_down(self, error: PeerError | None = None) -> None:
        """Answer nothing (as a peer cut off, or stopped): every call fails until :meth:`come_back`."""
        for method in ("heartbeat", "deliver", "sync", "cancel", "terminate", "logs"):
            self.errors[method] = error or PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} unreachable")

    def come_back(self) -> None:
        self.errors.clear()


class FakePeer:
    """A peer in memory with one h100 backend: it admits whatever it is handed and keeps it pending."""

    kind = "agentless"
    address = ""

    def __init__(self, peer_id: str, clock: Callable[[], int], h100: int = 8) -> None:
        self.peer_id = peer_id
        self.clock = clock
        self.h100 = h100
        self.jobs: dict[str, JobReport] = {}
        self.cancels: list[str] = []
        self.terminations: list[str] = []
        self.cancel_error: PeerError | None = None

    def heartbeat(self) -> list[PeerBackend]:
        availability = Availability(2, self.clock(), {"h100": self.h100}, {"h100": self.h100})
        advertised = normalize_advertised({"device-type": ["gpu"], "device-variant": ["h100"]})
        return [PeerBackend("default", advertised, availability, "fake")]

    def deliver(self, handoff: Handoff) -> JobReport:
        report = self.jobs.get(handoff.job_id)
        if report is None or report.nonce != handoff.nonce:
            report = self.jobs[handoff.job_id] = JobReport(handoff.job_id, handoff.nonce, JobState.PENDING, "default")
        return report

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        reports = {job_id: self.jobs[job_id] for job_id in job_ids if job_id in self.jobs}
        return SyncResult(reports, frozenset(job_ids) - reports.keys(), cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        self.cancels.append(job_id)
        if self.cancel_error is not None:
            raise self.cancel_error
        report = self.jobs.get(job_id)
        if report is None or nonce not in ("", report.nonce):
            return False
        if not report.state.terminal:
            self.jobs[job_id] = replace(report, state=JobState.KILLED, error="Cancelled")
        return True

    def terminate(self, job_id: str, nonce: str) -> Termination:
        self.terminations.append(job_id)
        if self.cancel_error is not None:
            raise self.cancel_error
        report = self.jobs.get(job_id)
        if report is None or report.nonce != nonce:
            return Termination.NOT_FOUND
        if not report.state.terminal:
            self.jobs[job_id] = replace(report, state=JobState.KILLED, error="Cancelled")
        return Termination.ENDED

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        return LogChunk((), cursor)


def cluster_config(tmp_path: Path, **placement: Any) -> ClusterConfig:
    return parse_cluster_config(
        {
            "name": "marin",
            "state_dir": str(tmp_path / "iris"),
            "placement": {
                "heartbeat_timeout_seconds": 5,
                "delivery_timeout_seconds": 5,
                "heartbeat_staleness_seconds": 120,
                **placement,
            },
            "backends": [{"id": "cpu", "kind": "process", "max_running_jobs": 4}],
            "peers": [
                {
                    "id": "cw-h100",
                    "kind": "agentless",
                    "backends": [{"id": "default", "kind": "process", "devices": {"h100": 4}}],
                    "allowed_submitters": ["*@example.com"],
                },
                {
                    "id": "cw-gb200",
                    "kind": "agentless",
                    "backends": [{"id": "default", "kind": "process", "devices": {"gb200": 2}}],
                    "allowed_submitters": ["*@example.com"],
                },
            ],
        }
    )


class World:
    """A cluster ``marin`` (one CPU backend) with peers ``cw-h100`` (4 h100) and ``cw-gb200`` (2 gb200)."""

    def __init__(self, tmp_path: Path, store: FederationStore, **placement: Any) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.config = cluster_config(tmp_path, **placement)
        self.clock = Clock()
        self.jitter = Jitter(1.0)
        self.backends = build_local_backends(self.config)
        self.real_peers = build_peers(self.config)
        self.peers: dict[str, Any] = {peer_id: ScriptedPeer(peer) for peer_id, peer in self.real_peers.items()}
        self.gates = tmp_path / "gates"
        self.gates.mkdir()

    def federation(self, peers: dict[str, Any] | None = None) -> Federation:
        return Federation(
            self.config,
            self.store,
            backends=self.backends,
            peers=self.peers if peers is None else peers,
            clock=self.clock,
            jitter=self.jitter,
        )

    def add_peer(self, peer_id: str, attributes: dict[str, list[str]] | None = None, **devices: int) -> ScriptedPeer:
        """Another agentless peer on a real process backend (stopped with the world)."""
        backend = ProcessBackend("default", self.tmp_path / peer_id, devices=devices, attributes=attributes)
        self.real_peers[peer_id] = AgentlessPeer(peer_id, [backend], allowed_submitters=["*@example.com"])
        self.peers[peer_id] = ScriptedPeer(self.real_peers[peer_id])
        return self.peers[peer_id]

    def peer_backend(self, peer_id: str) -> ProcessBackend:
        peer = self.real_peers[peer_id]
        assert isinstance(peer, AgentlessPeer)
        backend = peer.backends["default"]
        assert isinstance(backend, ProcessBackend)
        return backend

    def held(self, name: str, before: str = "") -> str:
        """A command that waits until ``release(name)``."""
        prefix = f"{before}; " if before else ""
        return f"{prefix}while [ ! -e {self.gates / name} ]; do sleep 0.02; done"

    def release(self, name: str) -> None:
        (self.gates / name).touch()

    def job(self, job_id: str) -> JobRecord:
        record = self.store.get_job(job_id)
        assert record is not None, f"{job_id} is not in the store"
        return record

    def close(self) -> None:
        """Let hanging fake calls return, and stop every job still queued or running anywhere."""
        for peer in self.peers.values():
            if isinstance(peer, ScriptedPeer):
                for gate in peer.hangs.values():
                    gate.set()
        for backend in [*self.backends.values(), *(self.peer_backend(p) for p in self.real_peers)]:
            assert isinstance(backend, ProcessBackend)
            for job_id in backend.live_job_ids():
                backend.cancel(job_id)


def spec(
    job_id: str = "/alice/train",
    command: str = "echo done",
    *,
    h100: int = 0,
    gb200: int = 0,
    tpu: int = 0,
    pin: str = "",
    deadline: int | None = None,
    **lifecycle: Any,
) -> JobSpec:
    device: dict[str, Any] = {"type": "cpu"}
    if h100:
        device = {"type": "gpu", "variant": "h100", "count": h100}
    elif gb200:
        device = {"type": "gpu", "variant": "gb200", "count": gb200}
    elif tpu:
        device = {"type": "tpu", "variant": "v5p-8", "count": tpu}
    return parse_job(
        {
            "job_id": job_id,
            "command": command,
            "resources": {"device": device},
            "target_cluster": pin,
            "scheduling_deadline_ms": deadline,
            **lifecycle,  # on_peer_lost, start_timeout_seconds
        }
    )


def tick_until(
    federation: Federation, store: FederationStore, job_id: str, *states: JobState, timeout: float = 10.0
) -> JobRecord:
    deadline = time.monotonic() + timeout
    while True:
        federation.tick()
        record = store.get_job(job_id)
        if record is not None and record.state in states:
            return record
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} never reached {[s.value for s in states]}: {record}")
        time.sleep(0.03)


def event_kinds(store: FederationStore, job_id: str) -> list[str]:
    return [event.kind for event in store.events(job_id)]

"""A receiving cluster on a real store and a real process backend, for the peer-side tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from iris_airflow_provider.cluster.build import build_local_backends
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.peers.wire import HandoffRequest
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.receiver import Receiver
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.store import FederationStore


class Peer:
    """Cluster ``cw-east`` receiving from ``marin``: one h100 backend; runner runs recorded, not created."""

    def __init__(self, tmp_path: Path, store: FederationStore) -> None:
        config = parse_cluster_config(
            {
                "name": "cw-east",
                "state_dir": str(tmp_path / "state"),
                "federation": {"allowed_submitters": ["*@example.com", "ops-bot"]},
                "backends": [{"id": "default", "kind": "process", "devices": {"h100": 8}}],
            }
        )
        self.store = store
        self.federation = Federation(config, store, backends=build_local_backends(config), peers={})
        self.runs: list[tuple[str, str]] = []
        self.run_failures = 0
        self.receiver = Receiver(self.federation, start_run=self._start_run)

    def _start_run(self, job: JobRecord) -> None:
        if self.run_failures:
            self.run_failures -= 1
            raise RuntimeError("the runner DAG is not parsed yet")
        if (job.job_id, job.nonce) not in self.runs:
            self.runs.append((job.job_id, job.nonce))

    def handoff(self, nonce: str = "n1", *, caller: str = "marin", **overrides: Any) -> Any:
        request = {
            "job_id": "/alice/train",
            "nonce": nonce,
            "requester": caller,
            "owner_principal": "alice@example.com",
            "submitting_user": "alice@example.com",
            "submitted_at_ms": 1,
            "backend_id": "default",
            "spec": {
                "command": "echo trained",
                "resources": {"device": {"type": "gpu", "variant": "h100", "count": 1}},
            },
            **overrides,
        }
        return self.receiver.handoff(caller, HandoffRequest.model_validate(request))

    def wait_until_finished(self, job_id: str = "marin:/alice/train") -> JobRecord:
        deadline = time.monotonic() + 30
        while True:
            self.federation.tick()
            job = self.store.get_job(job_id)
            assert job is not None
            if job.terminal:
                return job
            assert time.monotonic() < deadline, job
            time.sleep(0.1)


def stop_all_jobs(peer: Peer) -> None:
    for backend in peer.federation.backends.values():
        for job_id in backend.live_job_ids():  # type: ignore[attr-defined]
            backend.cancel(job_id)

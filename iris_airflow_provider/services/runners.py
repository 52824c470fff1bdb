"""Who runs a job: one of this cluster's backends (local and received jobs) or a peer (sent jobs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.peers.base import Peer
from iris_airflow_provider.store.records import JobRecord

RUN_HERE = (Direction.LOCAL, Direction.RECEIVED)  # jobs one of this cluster's backends runs


@dataclass(frozen=True, slots=True)
class Runners:
    """The configured backends and peers, and which of them runs a given job."""

    backends: Mapping[str, Backend]
    peers: Mapping[str, Peer]

    def backend_of(self, job: JobRecord) -> Backend | None:
        """The local backend running ``job``; None for a sent job or a backend no longer configured."""
        return self.backends.get(job.backend_id) if job.direction in RUN_HERE else None

    def peer_of(self, job: JobRecord) -> Peer | None:
        """The peer ``job`` was handed to; None for a job run here or a peer no longer configured."""
        return self.peers.get(job.peer_id) if job.direction is Direction.SENT else None

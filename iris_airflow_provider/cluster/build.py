"""Backends and peers built from the cluster configuration."""

from __future__ import annotations

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.backends.process import ProcessBackend
from iris_airflow_provider.cluster.config import BackendConfig, ClusterConfig
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.base import Peer


def build_backend(config: ClusterConfig, owner: str, backend: BackendConfig) -> Backend:
    """``owner`` scopes the state: this cluster's name for local backends, the peer id for a peer's."""
    return ProcessBackend(
        backend.id,
        config.backend_state_dir(owner, backend),
        devices=backend.devices,
        device_type=backend.device_type,
        attributes=backend.attributes,
        max_running_jobs=backend.max_running_jobs,
        env=backend.env,
    )


def build_local_backends(config: ClusterConfig) -> dict[str, Backend]:
    return {b.id: build_backend(config, config.name, b) for b in config.backends}


def build_peers(config: ClusterConfig) -> dict[str, Peer]:
    return {
        peer.id: AgentlessPeer(peer.id, [build_backend(config, peer.id, b) for b in peer.backends])
        for peer in config.peers
    }

"""The one place objects are built: a cluster file's backends, peers and federation."""

from __future__ import annotations

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.cluster.config import (
    AirflowPeerConfig,
    BackendConfig,
    ClusterConfig,
    KubernetesBackendConfig,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.base import Peer
from iris_airflow_provider.peers.identity import TokenMinter, read_pem
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.store import FederationStore


def build_backend(config: ClusterConfig, owner: str, backend: BackendConfig) -> Backend:
    """``owner`` scopes the state: this cluster's name for local backends, the peer id for a peer's."""
    if isinstance(backend, KubernetesBackendConfig):
        # Imported here: the Kubernetes client is only loaded by clusters that use it.
        from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend.from_config(backend)
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
    peers: dict[str, Peer] = {}
    minter: TokenMinter | None = None
    for peer in config.peers:
        if isinstance(peer, AirflowPeerConfig):
            if minter is None:
                minter = token_minter(config, peer.id)
            peers[peer.id] = AirflowPeer(
                peer.id,
                peer.url,
                minter,
                timeout_seconds=peer.timeout_seconds,
                delivery_timeout_seconds=config.placement.delivery_timeout_seconds,
                allow_insecure_http=peer.allow_insecure_http,
            )
        else:
            backends = [build_backend(config, peer.id, b) for b in peer.backends]
            peers[peer.id] = AgentlessPeer(peer.id, backends, allowed_submitters=peer.allowed_submitters)
    return peers


def token_minter(config: ClusterConfig, peer_id: str) -> TokenMinter:
    """Signs this cluster's calls to Airflow peers with ``federation.private_key``."""
    if not config.federation.private_key:
        raise SpecError.single(
            "federation.private_key",
            f"is required to call the Airflow peer {peer_id}: generate a key pair with `iris-federation keygen`",
        )
    try:
        return TokenMinter(config.name, read_pem(config.federation.private_key))
    except (OSError, ValueError) as error:
        raise SpecError.single("federation.private_key", f"cannot be used: {error}") from None


def build_federation(config: ClusterConfig, store: FederationStore) -> Federation:
    """The federation of a cluster file: its local backends and its peers, built from it."""
    return Federation(config, store, backends=build_local_backends(config), peers=build_peers(config))

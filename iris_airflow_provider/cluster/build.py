"""The one place objects are built: a cluster file's backends, peers and federation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from iris_airflow_provider.backends.base import Backend
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.cluster.config import (
    AirflowPeerConfig,
    BackendConfig,
    ClusterConfig,
    KubernetesBackendConfig,
    check_peer_url,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.base import Peer
from iris_airflow_provider.peers.identity import TokenMinter, read_pem
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_tokens import JobTokens
from iris_airflow_provider.store.store import FederationStore


def build_backend(config: ClusterConfig, owner: str, backend: BackendConfig) -> Backend:
    """``owner`` scopes the state: this cluster's name for local backends, the peer id for a peer's."""
    if isinstance(backend, KubernetesBackendConfig):
        # Imported here: the Kubernetes client is only loaded by clusters that use it.
        from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend.from_config(backend, bundles=config.bundle_store())
    return ProcessBackend(
        backend.id,
        config.backend_state_dir(owner, backend),
        devices=backend.devices,
        device_type=backend.device_type,
        attributes=backend.attributes,
        max_running_jobs=backend.max_running_jobs,
        env=backend.env,
        bundles=config.bundle_store(),
    )


def build_local_backends(config: ClusterConfig) -> dict[str, Backend]:
    return {b.id: build_backend(config, config.name, b) for b in config.backends}


@dataclass(frozen=True, slots=True)
class PeerEndpoint:
    """An Airflow peer as its connection names it: the URL, and the private key (PEM) this cluster
    signs its calls to that peer with ("": the cluster's ``federation.private_key``)."""

    url: str
    private_key: str = ""


def build_peers(config: ClusterConfig, endpoints: Mapping[str, PeerEndpoint] | None = None) -> dict[str, Peer]:
    """``endpoints``: the peers configured by connection (``conn_id``), resolved by the caller."""
    peers: dict[str, Peer] = {}
    minter: TokenMinter | None = None
    for index, peer in enumerate(config.peers):
        if isinstance(peer, AirflowPeerConfig):
            url, peer_minter = peer.url, None
            if peer.conn_id:
                endpoint = (endpoints or {}).get(peer.id)
                if endpoint is None:
                    raise SpecError.single(
                        f"peers[{index}].conn_id", f"connection {peer.conn_id!r} of peer {peer.id} was not looked up"
                    )
                try:
                    url = check_peer_url(endpoint.url, peer.allow_insecure_http)
                except ValueError as error:
                    raise SpecError.single(f"connection {peer.conn_id} (peer {peer.id}): host", str(error)) from None
                if endpoint.private_key:
                    peer_minter = _minter(config.name, endpoint.private_key, f"connection {peer.conn_id}: password")
            if peer_minter is None:
                if minter is None:
                    minter = token_minter(config, peer.id)
                peer_minter = minter
            peers[peer.id] = AirflowPeer(
                peer.id,
                url,
                peer_minter,
                timeout_seconds=peer.timeout_seconds,
                delivery_timeout_seconds=config.placement.delivery_timeout_seconds,
                allow_insecure_http=peer.allow_insecure_http,
                bundles=config.bundle_store(),
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
            f"is required to call the Airflow peer {peer_id} (unless the password of its connection holds the key): "
            "generate a key pair with `iris-federation keygen`",
        )
    return _minter(config.name, config.federation.private_key, "federation.private_key")


def _minter(cluster: str, private_key: str, where: str) -> TokenMinter:
    try:
        return TokenMinter(cluster, read_pem(private_key))
    except (OSError, ValueError) as error:
        raise SpecError.single(where, f"cannot be used: {error}") from None


def build_federation(
    config: ClusterConfig,
    store: FederationStore,
    endpoints: Mapping[str, PeerEndpoint] | None = None,
    job_tokens: JobTokens | None = None,
    *,
    own_url: str = "",
) -> Federation:
    """The federation of a cluster file: its local backends and its peers, built from it; with
    ``job_tokens``, every job it launches can call back (submit children); ``own_url``: where users reach
    this cluster's api-server (the origin of its serving relay, unless ``federation.public_parent`` says)."""
    return Federation(
        config,
        store,
        backends=build_local_backends(config),
        peers=build_peers(config, endpoints),
        job_tokens=job_tokens,
        own_url=own_url,
    )

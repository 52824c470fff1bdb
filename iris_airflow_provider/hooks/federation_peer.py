"""An Airflow peer as an Airflow connection (type ``irisfederationpeer``): its host is the peer's
api-server URL and its password the private key (Ed25519 PEM) this cluster signs its calls to
that peer with. Kept in a secrets backend (Vault, Google Secret Manager, AWS Secrets Manager ...),
the key never sits in a file every component must have::

    AIRFLOW_CONN_CW_EAST='{"conn_type": "irisfederationpeer", "host": "https://airflow.cw-east.example.com",
                           "password": "-----BEGIN PRIVATE KEY-----\\n..."}'

and in the cluster configuration ``peers: [{id: cw-east, kind: airflow, conn_id: cw_east}]``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from iris_airflow_provider.cluster.build import PeerEndpoint, build_peers
from iris_airflow_provider.cluster.config import AirflowPeerConfig, ClusterConfig
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.hooks.cluster_configuration import cluster_config


def peer_url(conn: Any) -> str:
    """The URL a connection names: its host when that is a URL, else ``schema://host:port`` (https)."""
    host = (conn.host or "").strip()
    if "://" in host:
        return host.rstrip("/")
    if not host:
        return ""
    port = f":{conn.port}" if conn.port else ""
    return f"{conn.schema or 'https'}://{host}{port}"


class FederationPeerHook(BaseHook):
    """Reaches one Airflow peer named by a connection (its form is declared in the provider's
    metadata, ``get_provider_info``)."""

    conn_name_attr = "iris_peer_conn_id"
    default_conn_name = "iris_federation_peer_default"
    conn_type = "irisfederationpeer"
    hook_name = "Iris Federation Peer"

    def __init__(self, iris_peer_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.iris_peer_conn_id = iris_peer_conn_id

    def endpoint(self) -> PeerEndpoint:
        conn = self.get_connection(self.iris_peer_conn_id)
        url = peer_url(conn)
        if not url:
            raise SpecError.single(f"connection {self.iris_peer_conn_id}: host", "must be the peer's URL (https://...)")
        return PeerEndpoint(url, conn.password or "")

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: a signed heartbeat to the peer, as this cluster's placement makes.

        The peer is the configured Airflow peer using this connection, else the one at the same URL:
        the button tests a copy of the form under a random connection id."""
        try:
            config = cluster_config()
            endpoint = self.endpoint()
            peer = _configured_peer(config, self.iris_peer_conn_id, endpoint.url)
            if peer is None:
                return False, (
                    f"no Airflow peer of cluster {config.name} uses connection {self.iris_peer_conn_id} or is at "
                    f"{endpoint.url}: add one to the cluster configuration (peers: [{{id: <its cluster name>, "
                    "kind: airflow, conn_id: <this connection>}])"
                )
            single = config.model_copy(update={"peers": [peer]})
            client = build_peers(single, {peer.id: endpoint})[peer.id]
            backends = client.heartbeat()
        except Exception as error:  # the Test button shows any failure as its message
            return False, str(error)
        names = ", ".join(b.backend_id for b in backends)
        return True, f"peer {peer.id} answered with {len(backends)} backend(s): {names}"


def _configured_peer(config: ClusterConfig, conn_id: str, url: str) -> AirflowPeerConfig | None:
    peers = [p for p in config.peers if isinstance(p, AirflowPeerConfig)]
    for peer in peers:
        if peer.conn_id == conn_id:
            return peer
    for peer in peers:
        if peer.url == url:
            return peer
        if peer.conn_id:
            try:
                if FederationPeerHook(peer.conn_id).endpoint().url == url:
                    return peer
            except Exception:  # another peer's connection missing or broken: not this one
                continue
    return None


def peer_endpoints(config: ClusterConfig) -> dict[str, PeerEndpoint]:
    """The Airflow peers the configuration names by connection, looked up (secrets backends included)."""
    return {
        peer.id: FederationPeerHook(peer.conn_id).endpoint()
        for peer in config.peers
        if isinstance(peer, AirflowPeerConfig) and peer.conn_id
    }

"""This process's serving endpoints: the minter and checker of capability URLs, and where the
parent's relay may forward (its configured Airflow peers), built once per cluster file."""

from __future__ import annotations

import threading

from iris_airflow_provider.cluster.config import AirflowPeerConfig
from iris_airflow_provider.hooks.cluster_configuration import cluster_config, cluster_config_source
from iris_airflow_provider.hooks.federation_peer import peer_endpoints
from iris_airflow_provider.hooks.runtime import get_federation, own_url
from iris_airflow_provider.services.serving import Serving, read_secret
from iris_airflow_provider.store.records import JobRecord

_lock = threading.Lock()
_serving: dict[tuple[str, str], Serving] = {}
_relays: dict[tuple[str, str], dict[str, str]] = {}


def get_serving() -> Serving:
    source = cluster_config_source()
    with _lock:
        serving = _serving.get(source)
    if serving is None:
        config = cluster_config()
        serving = Serving(
            cluster=config.name,
            secret=read_secret(config.serving.token_secret, config.federation.private_key),
            own_url=own_url(),
            public_parent=config.federation.public_parent,
            backends=get_federation().backends,
            ttl_seconds=config.serving.token_ttl_seconds,
        )
        with _lock:
            serving = _serving.setdefault(source, serving)
    return serving


def minted_urls(job: JobRecord) -> dict[str, str]:
    """Where this cluster serves a received job's ports, for its requester's sync."""
    return get_serving().urls(job)


def relay_targets() -> dict[str, str]:
    """The configured Airflow peers by cluster name, with their api-server URLs: the only places
    the relay forwards to."""
    source = cluster_config_source()
    with _lock:
        targets = _relays.get(source)
    if targets is None:
        config = cluster_config()
        endpoints = peer_endpoints(config)
        targets = {
            peer.id: peer.url or endpoints[peer.id].url for peer in config.peers if isinstance(peer, AirflowPeerConfig)
        }
        with _lock:
            targets = _relays.setdefault(source, targets)
    return targets

"""This process's federation: the cluster configuration, the store, backends and peers, built once.

Read from the ``[iris_federation]`` configuration section (``AIRFLOW__IRIS_FEDERATION__*``): the
cluster configuration (``cluster_configuration``), ``conn_id`` (the store's connection,
``iris_federation_default``) and ``default_deferrable``. Each is read once per process: a changed
configuration takes effect when the components restart.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable, Mapping

from airflow.providers.common.compat.sdk import conf

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.cluster.build import build_federation
from iris_airflow_provider.hooks.cluster_configuration import SECTION, cluster_config, cluster_config_source
from iris_airflow_provider.hooks.federation_peer import peer_endpoints
from iris_airflow_provider.hooks.federation_store import FederationStoreHook
from iris_airflow_provider.peers.identity import TokenVerifier
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.services.job_tokens import JobTokens
from iris_airflow_provider.services.peer_auth import PeerAuthenticator
from iris_airflow_provider.services.receiver import Receiver
from iris_airflow_provider.store.records import JobRecord

DEFAULT_CONN_ID = FederationStoreHook.default_conn_name

log = logging.getLogger(__name__)

_lock = threading.Lock()
_federations: dict[tuple[str, str, str], Federation] = {}


def default_conn_id() -> str:
    return conf.get(SECTION, "conn_id", fallback=DEFAULT_CONN_ID) or DEFAULT_CONN_ID


def default_deferrable() -> bool:
    """Whether the operator and the sensor wait in the triggerer unless told: ``[iris_federation]
    default_deferrable`` when it is set, else Airflow's own ``[operators] default_deferrable``.

    The provider's option has no default (it is empty unless set), which is how "unset" is told
    apart from an explicit false.
    """
    own = conf.get(SECTION, "default_deferrable", fallback="")
    if own is not None and str(own).strip():
        return bool(conf.getboolean(SECTION, "default_deferrable"))
    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def get_federation(conn_id: str | None = None) -> Federation:
    conn_id = conn_id or default_conn_id()
    key = (*cluster_config_source(), conn_id)
    with _lock:
        federation = _federations.get(key)
        if federation is None:
            config = cluster_config()
            store = FederationStoreHook(conn_id).get_store()
            federation = build_federation(
                config, store, peer_endpoints(config), job_tokens(config.name), own_url=own_url()
            )
            _federations[key] = federation
        return federation


def job_tokens(cluster: str) -> JobTokens | None:
    """Signs and checks the tokens of this cluster's jobs (services/job_tokens.py).

    The key is derived from Airflow's own ``[api_auth] jwt_secret``, which every component of a
    deployment already shares (its workers' Execution API tokens need it), so the api-server checks
    what a worker, the triggerer or the tick signed; it is derived, not used as it is, so a job
    token is never an Airflow API token or the reverse. Jobs call back at ``[api] base_url``.
    """
    secret = conf.get("api_auth", "jwt_secret", fallback="") or ""
    if not secret:  # Airflow generates one; without it jobs run, but cannot submit children
        log.warning("[api_auth] jwt_secret is not set: jobs get no job token and cannot submit children")
        return None
    key = hmac.new(secret.encode(), b"iris-federation job tokens v1", hashlib.sha256).digest()
    base_url = conf.get("api", "base_url", fallback="") or "http://localhost:8080"
    return JobTokens(cluster, key, federation_url=base_url)


_receivers: dict[tuple[str, str, str], Receiver] = {}


_verifiers: dict[tuple[str, str], TokenVerifier] = {}


def get_verifier() -> TokenVerifier:
    """Checks the signed identity of clusters calling this one's peer API: their trusted keys, and
    this cluster's name as the audience. Built once per cluster file, like the federation itself,
    not on every request: keys are read and parsed here."""
    from iris_airflow_provider.peers.identity import read_pem

    source = cluster_config_source()
    with _lock:
        verifier = _verifiers.get(source)
        if verifier is None:
            config = cluster_config()
            trusted = config.federation.trusted_peers
            verifier = _verifiers[source] = TokenVerifier(
                config.name, {name: [read_pem(key) for key in peer.public_keys()] for name, peer in trusted.items()}
            )
        return verifier


def get_peer_authenticator() -> PeerAuthenticator:
    """The peer API's authentication: a verified token, used once (its jti recorded in the store)."""
    return PeerAuthenticator(get_verifier(), get_federation().store)


def get_bundle_store(conn_id: str | None = None) -> BundleStore:
    """This cluster's workdir bundles (the cluster file's ``bundles:``): where the operator packs
    them and the peer API receives them."""
    return get_federation(conn_id).config.bundle_store()


def get_receiver(
    start_run: Callable[[JobRecord], None],
    serving_urls: Callable[[JobRecord], Mapping[str, str]] | None = None,
    conn_id: str | None = None,
) -> Receiver:
    """The peer side, for the peer API in the api-server; ``start_run`` makes each accepted
    handoff visible in Airflow (the plugin passes the runner DAG's), ``serving_urls`` mints where
    this cluster serves a received job's ports (the plugin passes ``hooks/serving.py``'s)."""
    federation = get_federation(conn_id)
    key = (*cluster_config_source(), conn_id or default_conn_id())
    with _lock:
        receiver = _receivers.get(key)
        if receiver is None:
            receiver = _receivers[key] = Receiver(federation, start_run=start_run, serving_urls=serving_urls)
        return receiver


def own_url() -> str:
    """This cluster's api-server as users reach it: Airflow's ``[api] base_url``."""
    return (conf.get("api", "base_url", fallback="") or "http://localhost:8080").rstrip("/")

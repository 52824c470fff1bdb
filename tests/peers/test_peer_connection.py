"""An Airflow peer named by an Airflow connection (type ``irisfederationpeer``): its URL from the
connection's host and this cluster's signing key from its password, looked up by Airflow (here from
the environment secrets backend, as Vault or a cloud secret manager would serve it), over real HTTP
against the peer API of a real receiving cluster (cw-east, trusting marin's key)."""

from __future__ import annotations

import json

import pytest
from airflow.models.connection import Connection
from fastapi import FastAPI

from iris_airflow_provider.cluster.build import build_peers
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.hooks import cluster_configuration
from iris_airflow_provider.hooks.federation_peer import FederationPeerHook, peer_endpoints, peer_url
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.peer_api import app
from tests.peers.conftest import MARIN_PRIVATE, OTHER_PRIVATE
from tests.receiving_peer import Peer


@pytest.fixture
def url(peer: Peer, serve) -> str:  # type: ignore[no-untyped-def]
    api_server = FastAPI()
    api_server.mount(API_PREFIX, app)
    return str(serve(api_server))


def marin(monkeypatch: pytest.MonkeyPatch, **peer: object) -> None:
    """This cluster, marin, with no key of its own in the configuration: only its peer's connection."""
    document = {"name": "marin", "peers": [{"id": "cw-east", "kind": "airflow", "conn_id": "cw_east", **peer}]}
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_JSON", json.dumps(document))


def connection(monkeypatch: pytest.MonkeyPatch, host: str, password: str) -> None:
    body = {"conn_type": "irisfederationpeer", "host": host, "password": password}
    monkeypatch.setenv("AIRFLOW_CONN_CW_EAST", json.dumps(body))


def test_the_peer_is_reached_at_its_connections_url_with_the_key_in_its_password(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    marin(monkeypatch, allow_insecure_http=True)
    connection(monkeypatch, url, MARIN_PRIVATE)
    config = cluster_configuration.cluster_config()
    assert config.federation.private_key == ""
    peers = build_peers(config, peer_endpoints(config))
    [backend] = peers["cw-east"].heartbeat()
    assert backend.backend_id == "default"
    # The connection form's Test button: the same signed heartbeat.
    assert FederationPeerHook("cw_east").test_connection() == (True, "peer cw-east answered with 1 backend(s): default")


def test_the_test_button_says_why_a_peer_refuses(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    marin(monkeypatch, allow_insecure_http=True)
    connection(monkeypatch, url, OTHER_PRIVATE)  # a key cw-east does not trust for marin
    ok, message = FederationPeerHook("cw_east").test_connection()
    assert not ok and "is not one of its trusted keys here" in message
    marin(monkeypatch)  # plain http:// is refused unless the peer allows it
    connection(monkeypatch, url, MARIN_PRIVATE)
    ok, message = FederationPeerHook("cw_east").test_connection()
    assert not ok and message == (
        f"connection cw_east (peer cw-east): host: {url!r} is plain http://, which sends peer tokens and jobs in "
        "the clear: use https://, or set allow_insecure_http: true on this peer (tests and local demos only)"
    )


def test_a_connection_no_peer_uses_is_named_with_the_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    marin(monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_SPARE", json.dumps({"conn_type": "irisfederationpeer", "host": "https://x"}))
    ok, message = FederationPeerHook("spare").test_connection()
    assert not ok and message.startswith("no Airflow peer of cluster marin uses connection spare or is at https://x")
    # The Test button tests a copy of the form under a random id: the peer is then found by its URL.
    monkeypatch.setenv("AIRFLOW_CONN_CW_EAST", json.dumps({"conn_type": "irisfederationpeer", "host": "https://x"}))
    ok, message = FederationPeerHook("spare").test_connection()
    assert not ok and "is required to call the Airflow peer cw-east" in message  # found: now it needs marin's key


def test_a_connection_without_a_host_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_CW_EAST", json.dumps({"conn_type": "irisfederationpeer", "password": "k"}))
    with pytest.raises(SpecError, match="connection cw_east: host: must be the peer's URL"):
        FederationPeerHook("cw_east").endpoint()


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("irisfederationpeer://airflow.cw-east.example.com:8443", "https://airflow.cw-east.example.com:8443"),
        ("irisfederationpeer://airflow.cw-east.example.com", "https://airflow.cw-east.example.com"),
    ],
)
def test_a_connection_uri_names_an_https_url(uri: str, expected: str) -> None:
    assert peer_url(Connection(conn_id="x", uri=uri)) == expected
    assert peer_url(Connection(conn_id="x", conn_type="irisfederationpeer", host=expected + "/")) == expected


def test_a_peer_has_a_url_or_a_connection_not_both_nor_neither() -> None:
    for peer, says in (({}, "one of them"), ({"url": "https://a", "conn_id": "a"}, "not both")):
        with pytest.raises(SpecError) as error:
            parse_cluster_config({"name": "marin", "peers": [{"id": "cw-east", "kind": "airflow", **peer}]}, source="c")
        [problem] = error.value.problems
        assert problem.path == "c: peers[0]" and problem.message.endswith(says), problem

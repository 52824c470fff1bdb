"""What a parent keeps of the serving URLs a peer reports for a job it handed there
(``core/serving.py``'s ``accepted_serving_urls``): its own relay for that peer, or the peer's own
api-server, for a port the job declares under its own name; nothing else reaches its UI, log or XCom."""

from __future__ import annotations

import pytest

from iris_airflow_provider.core.serving import MAX_SERVING_URL_CHARS, ServingOrigins, accepted_serving_urls

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJwb3J0IjoiaHR0cCJ9.c2lnbmF0dXJl"
ORIGINS = ServingOrigins("cw-east", "https://iris.example.com", "https://cw-east.example.com")
RELAYED = f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/"
DIRECT = f"https://cw-east.example.com/proxy/t/{TOKEN}/http/"


def check(reported: dict[str, str], ports: tuple[str, ...] = ("http", "metrics"), origins: ServingOrigins = ORIGINS):
    return accepted_serving_urls(reported, declared_ports=ports, origins=origins)


@pytest.mark.parametrize("url", [RELAYED, DIRECT])
def test_the_parents_relay_for_that_peer_and_the_peers_own_url_are_kept(url):
    assert check({"http": url}) == ({"http": url}, [])


def test_each_port_is_judged_on_its_own():
    metrics = f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/metrics/"
    kept, dropped = check({"http": "https://evil.example/login", "metrics": metrics})
    assert kept == {"metrics": metrics}
    assert len(dropped) == 1 and dropped[0].startswith("port 'http': ")


def test_a_relay_origin_given_with_a_trailing_slash_is_the_same_origin():
    origins = ServingOrigins("cw-east", "https://iris.example.com/", "")
    assert check({"http": RELAYED}, origins=origins)[0] == {"http": RELAYED}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"https://iris.example.com/proxy/t/cluster=cw-west/{TOKEN}/http/", "another peer's cluster tag"),
        (f"https://iris.example.com/proxy/t/{TOKEN}/http/", "the parent's own capability route (it mints none)"),
        (f"https://cw-east.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/", "a relay on the peer"),
        (f"https://evil.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/", "another host"),
        (f"https://iris.example.com.evil.example/proxy/t/cluster=cw-east/{TOKEN}/http/", "a host extending ours"),
        (f"https://iris.example.com@evil.example/proxy/t/cluster=cw-east/{TOKEN}/http/", "userinfo"),
        (f"http://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/", "another scheme"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/../../../login/", "an extra path"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/login", "an extra path"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http", "no trailing slash"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/?next=https://evil.example", "a query"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/http/#x", "a fragment"),
        ("https://iris.example.com/proxy/t/cluster=cw-east/a/b/http/", "a token of two segments"),
        ("https://iris.example.com/proxy/t/cluster=cw-east/%2e%2e/http/", "a token outside the JWT charset"),
        ("https://iris.example.com/proxy/t/cluster=cw-east//http/", "an empty token"),
        (f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/metrics/", "another port than its key"),
        ("javascript:alert(1)", "not a URL of ours at all"),
    ],
)
def test_anything_else_is_dropped(url, why):
    kept, dropped = check({"http": url})
    assert kept == {}, why
    assert dropped == [
        "port 'http': not this cluster's relay for the peer, nor the peer's own api-server, serving that port"
    ]


def test_a_port_the_job_does_not_declare_is_dropped_even_at_a_good_url():
    url = f"https://iris.example.com/proxy/t/cluster=cw-east/{TOKEN}/admin/"
    assert check({"admin": url}) == ({}, ["port 'admin': the job declares no such port"])


def test_a_url_longer_than_the_bound_is_dropped():
    token = "a" * MAX_SERVING_URL_CHARS
    url = f"https://iris.example.com/proxy/t/cluster=cw-east/{token}/http/"
    assert check({"http": url}) == ({}, [f"port 'http': longer than {MAX_SERVING_URL_CHARS} characters"])


def test_a_peer_without_an_api_server_has_only_the_relay_form():
    agentless = ServingOrigins("cw-east", "https://iris.example.com", "")
    assert check({"http": DIRECT}, origins=agentless)[0] == {}
    assert check({"http": RELAYED}, origins=agentless)[0] == {"http": RELAYED}


def test_without_a_known_origin_nothing_is_kept():
    assert check({"http": RELAYED}, origins=ServingOrigins("cw-east", "", ""))[0] == {}

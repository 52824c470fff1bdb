"""Serving endpoints: a job's named ports, the capability tokens that open them, and their URLs.

A job declares named ports (``ports: [{"name": "http"}]``); the backend running it gives each a
port, handed to the job as ``IRIS_PORT_<NAME>``. The cluster running the job serves each port at a
capability URL on its api-server, ``/proxy/t/<token>/<name>/...``: the token is minted and checked
by that cluster alone (HS256, the cluster's own secret), scoped to one job incarnation and one port
name, with an expiry. A cluster with a public parent mints the parent's URL instead,
``https://<parent>/proxy/t/cluster=<cluster>/<token>/<name>/...``; the parent relays it blindly to
that peer (it never reads the token), and the peer checks it as for a direct call.

Pure: the clock comes in as ``now_s``; nothing here reads a file or the network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
from pydantic import Field, field_validator

from iris_airflow_provider.core.strict_model import StrictModel

MAX_PORTS = 16
PORT_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
PORT_ENV_PREFIX = "IRIS_PORT_"

PROXY_PREFIX = "/proxy"
CAPABILITY_ROUTE = f"{PROXY_PREFIX}/t"
RELAY_TAG = "cluster="
# Sent by a parent relaying a request, so the peer's rewritten redirects keep the relay's path.
RELAY_HEADER = "X-Iris-Relay-Cluster"

TOKEN_ALGORITHM = "HS256"
TOKEN_TYPE = "iris-serving"
MIN_SECRET_BYTES = 32


class PortSpec(StrictModel):
    """One named port a job serves on (the backend picks the number)."""

    name: str = Field(description="lowercase letters, digits and _, starting with a letter; at most 32 characters")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not PORT_NAME_PATTERN.fullmatch(value):
            raise ValueError(
                "must be 1-32 lowercase letters, digits or _, starting with a letter (it becomes "
                f"{PORT_ENV_PREFIX}<NAME> in the job's environment and a segment of its URL), got {value[:64]!r}"
            )
        return value


def check_ports(ports: tuple[PortSpec, ...]) -> tuple[PortSpec, ...]:
    """A job's ports, once each by name; else ``ValueError`` naming the repeated ones."""
    names = [port.name for port in ports]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"port names must be unique; repeated: {', '.join(repeated)}")
    return ports


def port_env_name(port_name: str) -> str:
    """``http`` -> ``IRIS_PORT_HTTP``: where a replica reads the number its port ``port_name`` got."""
    return PORT_ENV_PREFIX + port_name.upper()


def port_env(ports: dict[str, int]) -> dict[str, str]:
    return {port_env_name(name): str(number) for name, number in ports.items()}


# Tokens ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServingScope:
    """What a token opens: one port of one incarnation of one job, on one backend of one cluster."""

    cluster: str
    job_key: str  # where this cluster keeps the job (its store key, the backend's job id)
    nonce: str  # the incarnation
    backend_id: str
    port: str


class TokenRefusedError(Exception):
    """A token that opens nothing here; ``status`` is the HTTP answer (401 or 403)."""

    status = 401


class TokenInvalidError(TokenRefusedError):
    """Not a token this cluster signed (malformed, tampered or re-signed)."""


class TokenExpiredError(TokenRefusedError):
    """This cluster signed it, and it has expired."""


class TokenForeignError(TokenRefusedError):
    """Signed for another cluster: it is that cluster's to check, not this one's."""

    status = 403


class TokenScopeError(TokenRefusedError):
    """A valid token for another port, or for an incarnation that is not the one running now."""

    status = 403


def mint_token(secret: bytes, scope: ServingScope, *, now_s: int, ttl_s: int) -> str:
    """A capability token for ``scope``, valid from ``now_s`` for ``ttl_s`` seconds."""
    claims = {
        "typ": TOKEN_TYPE,
        "iss": scope.cluster,
        "job": scope.job_key,
        "inc": scope.nonce,
        "be": scope.backend_id,
        "port": scope.port,
        "iat": now_s,
        "exp": now_s + ttl_s,
    }
    return jwt.encode(claims, secret, algorithm=TOKEN_ALGORITHM)


def verify_token(secret: bytes, token: str, *, cluster: str, now_s: int) -> ServingScope:
    """The scope ``token`` opens on ``cluster``, or a :class:`TokenRefusedError` saying why not.

    Order matters for what a caller learns: a token naming another cluster is refused as foreign
    before its signature is checked (that cluster holds the key); a signature that does not check
    is invalid; only a genuine token is told it expired."""
    try:
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise TokenInvalidError("not a serving token") from None
    if not isinstance(unverified, dict) or unverified.get("typ") != TOKEN_TYPE:
        raise TokenInvalidError("not a serving token")
    if unverified.get("iss") != cluster:
        raise TokenForeignError(f"this token was minted by another cluster, not {cluster}")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[TOKEN_ALGORITHM],
            options={"verify_exp": False, "verify_iat": False, "require": ["exp", "iss"]},
        )
    except jwt.PyJWTError:
        raise TokenInvalidError("the token's signature does not check") from None
    fields = ("job", "inc", "be", "port")
    if not all(isinstance(claims.get(name), str) for name in fields) or not isinstance(claims.get("exp"), int):
        raise TokenInvalidError("the token lacks its scope")
    if now_s >= claims["exp"]:
        raise TokenExpiredError("the token has expired")
    return ServingScope(cluster, claims["job"], claims["inc"], claims["be"], claims["port"])


def token_issuer(token: str) -> str | None:
    """The cluster a serving token names as its minter, unverified (None when it is no serving token):
    enough to refuse a foreign token on a cluster that mints none."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    issuer = claims.get("iss") if isinstance(claims, dict) and claims.get("typ") == TOKEN_TYPE else None
    return issuer if isinstance(issuer, str) else None


def check_scope(scope: ServingScope, *, port: str, running_nonce: str | None) -> None:
    """``scope`` opens ``port`` of the incarnation running now (``running_nonce``), or TokenScopeError."""
    if scope.port != port:
        raise TokenScopeError(f"the token opens port {scope.port!r}, not {port!r}")
    if running_nonce != scope.nonce:
        raise TokenScopeError("the token belongs to an incarnation of the job that is not running")


# URLs --------------------------------------------------------------------------------------------


def capability_path(token: str, port: str) -> str:
    """Where a cluster serves ``port`` for ``token``, on its own api-server: ``/proxy/t/<token>/<port>``."""
    return f"{CAPABILITY_ROUTE}/{token}/{port}"


def relayed_path(cluster: str, token: str, port: str) -> str:
    """The same, through a parent: ``/proxy/t/cluster=<cluster>/<token>/<port>``."""
    return f"{CAPABILITY_ROUTE}/{RELAY_TAG}{cluster}/{token}/{port}"


def serving_url(*, token: str, port: str, own_url: str, cluster: str, public_parent: str = "") -> str:
    """The URL a user opens for ``port``: the public parent's relay when this cluster has one,
    else this cluster's own api-server. Ends with ``/``: the served app's root."""
    if public_parent:
        return public_parent.rstrip("/") + relayed_path(cluster, token, port) + "/"
    return own_url.rstrip("/") + capability_path(token, port) + "/"


def rewrite_location(location: str, *, prefix: str, upstream_origin: str) -> str:
    """A served app's ``Location`` as the caller must follow it: a root-relative path (``/login``)
    or an absolute URL back to the app itself gets the capability prefix the caller came through
    (``prefix``, with the relay's cluster tag when it came through a parent); anything else (a
    relative path, another site) is left alone."""
    if location.startswith(upstream_origin.rstrip("/") + "/") or location == upstream_origin.rstrip("/"):
        location = location[len(upstream_origin.rstrip("/")) :] or "/"
    if location.startswith("/") and not location.startswith("//"):
        return prefix.rstrip("/") + location
    return location


def check_public_parent(value: str) -> str:
    """``federation.public_parent``: the parent's origin. A bare host means https; plain http only
    for a loopback host (tests and demos), since the token travels in the URL."""
    if not value:
        return value
    url = value if "://" in value else f"https://{value}"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(
            f"must be the parent's origin, such as iris.example.com or https://iris.example.com, got {value!r}"
        )
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"must be an origin without a path (the relay lives at {CAPABILITY_ROUTE}/), got {value!r}")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"must be https:// (capability tokens travel in the URL), got {value!r}")
    return f"{parts.scheme}://{parts.netloc}"


# What a peer says it serves ----------------------------------------------------------------------

MAX_SERVING_URL_CHARS = 2048
# A JWT in compact form: base64url segments joined by dots (one path segment, nothing to escape).
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+){0,4}")


@dataclass(frozen=True, slots=True)
class ServingOrigins:
    """Where a parent accepts the serving URLs a peer reports for a job it handed there: its own relay
    for that peer (``<relay_origin>/proxy/t/cluster=<peer_id>/...``), or the peer's own api-server as
    the parent configured it (``<peer_url>/proxy/t/...``)."""

    peer_id: str
    relay_origin: str  # the parent's public origin: federation.public_parent, else its own api URL
    peer_url: str  # "" for a peer without an api-server (agentless)


def accepted_serving_urls(
    reported: Mapping[str, str], *, declared_ports: Iterable[str], origins: ServingOrigins
) -> tuple[dict[str, str], list[str]]:
    """The URLs of ``reported`` a parent may show, log and push for a job it handed to
    ``origins.peer_id`` (so a lying peer cannot plant a link to elsewhere), and why each other one
    was dropped. Each must be, for one of the job's ``declared_ports`` named by its key, exactly
    ``<relay_origin>/proxy/t/cluster=<peer_id>/<token>/<port>/`` or ``<peer_url>/proxy/t/<token>/<port>/``,
    the token one path segment of a JWT's characters, and at most MAX_SERVING_URL_CHARS long."""
    declared = set(declared_ports)
    prefixes = []
    if origins.relay_origin:
        prefixes.append(f"{origins.relay_origin.rstrip('/')}{CAPABILITY_ROUTE}/{RELAY_TAG}{origins.peer_id}/")
    if origins.peer_url:
        prefixes.append(f"{origins.peer_url.rstrip('/')}{CAPABILITY_ROUTE}/")
    accepted: dict[str, str] = {}
    dropped: list[str] = []
    for port, url in reported.items():
        problem = _serving_url_problem(port, url, declared, prefixes)
        if problem:
            dropped.append(f"port {str(port)[:40]!r}: {problem}")
        else:
            accepted[port] = url
    return accepted, dropped


def _serving_url_problem(port: object, url: object, declared: set[str], prefixes: list[str]) -> str:
    if not isinstance(port, str) or port not in declared:
        return "the job declares no such port"
    if not isinstance(url, str):
        return "not a URL"
    if len(url) > MAX_SERVING_URL_CHARS:
        return f"longer than {MAX_SERVING_URL_CHARS} characters"
    for prefix in prefixes:
        if url.startswith(prefix):
            token, slash, rest = url[len(prefix) :].partition("/")
            if slash and rest == f"{port}/" and TOKEN_PATTERN.fullmatch(token):
                return ""
    return "not this cluster's relay for the peer, nor the peer's own api-server, serving that port"

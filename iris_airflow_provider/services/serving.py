"""Serving endpoints on this cluster: mint the capability URL of each named port of a job it runs,
and open a token's port for the proxy (``plugins/serving_proxy.py``). The rules are pure
(``core/serving.py``); this reads the secret, the clock and the backend running the job."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from iris_airflow_provider.backends.base import Backend, ServedPort
from iris_airflow_provider.core.serving import (
    MIN_SECRET_BYTES,
    ServingScope,
    TokenForeignError,
    TokenInvalidError,
    TokenRefusedError,
    TokenScopeError,
    capability_path,
    check_scope,
    mint_token,
    relayed_path,
    serving_url,
    token_issuer,
    verify_token,
)
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.core.strict_model import StrictModel
from iris_airflow_provider.store.records import JobRecord

DEFAULT_TOKEN_TTL_SECONDS = 24 * 3600
MAX_TOKEN_TTL_SECONDS = 30 * 24 * 3600


class ServingSettings(StrictModel):
    """How this cluster signs the capability tokens of its jobs' serving endpoints."""

    token_secret: str = Field(
        default="",
        description=f"the HMAC secret signing capability tokens (at least {MIN_SECRET_BYTES} bytes), or the path of "
        "a file holding it; the same on every component. Default: derived from federation.private_key",
    )
    token_ttl_seconds: int = Field(
        default=DEFAULT_TOKEN_TTL_SECONDS,
        ge=60,
        le=MAX_TOKEN_TTL_SECONDS,
        description="how long a minted serving URL opens its port",
    )

    @field_validator("token_secret")
    @classmethod
    def _long_enough(cls, value: str) -> str:
        if value and not value.startswith(("/", "~")) and len(value.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"must be at least {MIN_SECRET_BYTES} bytes (or the path of a file holding the secret)")
        return value


class ServingUnavailableError(Exception):
    """The token is good but nothing serves its port now (not started yet, or finished)."""


def read_secret(token_secret: str, private_key: str) -> bytes | None:
    """The secret signing tokens: ``serving.token_secret`` (text or a file), else one derived from
    the cluster's federation private key (never the key itself); None when neither is configured."""
    if token_secret:
        if token_secret.startswith(("/", "~")):
            text = Path(token_secret).expanduser().read_text().strip()
            if len(text.encode()) < MIN_SECRET_BYTES:
                raise ValueError(
                    f"serving.token_secret: the file {token_secret} holds fewer than {MIN_SECRET_BYTES} bytes"
                )
            return text.encode()
        return token_secret.encode()
    if private_key:
        from iris_airflow_provider.peers.identity import read_pem

        return hashlib.sha256(b"iris-serving-token\0" + read_pem(private_key).encode()).digest()
    return None


@dataclass(frozen=True, slots=True)
class OpenedPort:
    """A token's port, open: where to forward, and the path prefix the caller sees (for redirects)."""

    target: ServedPort
    scope: ServingScope


class Serving:
    """Mints and checks this cluster's capability URLs."""

    def __init__(
        self,
        *,
        cluster: str,
        secret: bytes | None,
        own_url: str,
        public_parent: str,
        backends: Mapping[str, Backend],
        ttl_seconds: int = DEFAULT_TOKEN_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.secret = secret
        self.own_url = own_url
        self.public_parent = public_parent
        self.backends = backends
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    def urls(self, record: JobRecord) -> dict[str, str]:
        """The serving URL of each named port of ``record``'s incarnation, when it runs on one of this
        cluster's backends (a local job, or one a parent handed here); {} otherwise, or without a secret."""
        names = [str(port["name"]) for port in record.spec.get("ports") or ()]
        if record.direction not in (Direction.LOCAL, Direction.RECEIVED):
            return {}
        return self.urls_for(record.job_id, record.nonce, record.backend_id, names)

    def urls_for(self, job_key: str, nonce: str, backend_id: str, port_names: list[str]) -> dict[str, str]:
        if not port_names or self.secret is None or backend_id not in self.backends:
            return {}
        now = int(self.clock())
        urls = {}
        for name in port_names:
            token = mint_token(
                self.secret,
                ServingScope(self.cluster, job_key, nonce, backend_id, name),
                now_s=now,
                ttl_s=self.ttl_seconds,
            )
            urls[name] = serving_url(
                token=token, port=name, own_url=self.own_url, cluster=self.cluster, public_parent=self.public_parent
            )
        return urls

    def open(self, token: str, port: str) -> OpenedPort:
        """Where ``token`` opens ``port`` now; TokenRefusedError (401/403) or ServingUnavailableError."""
        if self.secret is None:
            issuer = token_issuer(token)
            if issuer is None:
                raise TokenInvalidError("not a serving token")
            if issuer != self.cluster:
                raise TokenForeignError(f"this token was minted by another cluster, not {self.cluster}")
            raise ServingUnavailableError(f"cluster {self.cluster} serves no ports: it has no serving.token_secret")
        scope = verify_token(self.secret, token, cluster=self.cluster, now_s=int(self.clock()))
        check_scope(scope, port=port, running_nonce=scope.nonce)
        backend = self.backends.get(scope.backend_id)
        if backend is None:
            raise TokenScopeError(f"cluster {self.cluster} has no backend {scope.backend_id}")
        target = backend.served_port(scope.job_key, port)
        if target is None:
            raise ServingUnavailableError("the job is not running, so nothing serves this port now")
        check_scope(scope, port=port, running_nonce=target.nonce)
        return OpenedPort(target, scope)


def caller_prefix(token: str, port: str, relayed_by_cluster: str) -> str:
    """The path prefix the caller used: the parent's relay form when a parent relayed the request."""
    return relayed_path(relayed_by_cluster, token, port) if relayed_by_cluster else capability_path(token, port)


__all__ = [
    "OpenedPort",
    "Serving",
    "ServingSettings",
    "ServingUnavailableError",
    "TokenRefusedError",
    "caller_prefix",
    "read_secret",
]

"""Job tokens: how a running job proves which job it is when it calls its cluster (to submit, wait
for and cancel its children).

A job is authenticated by its token alone, never by where it calls from. The cluster signs each
token (HS256 under a key of its own, see ``hooks/runtime.py``) for one incarnation of one job:
``sub`` is where the store keeps the job (its key), ``nonce`` its incarnation, ``aud`` this
cluster's job API, ``iss`` this cluster. Tokens are short-lived (``TOKEN_TTL_SECONDS``) and renewed
while the job is live: the backend gets a fresh one at start, the tick rewrites it for every live
job on backends that keep it in a file or a Secret (:func:`renew_token_files`), and a job may trade a valid token
for a fresh one (``renew``) while it is live. A token of a finished or replaced incarnation is
refused even before it expires, because every use checks the incarnation against the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jwt

from iris_airflow_provider.backends.base import FEDERATION_URL_ENV, JOB_TOKEN_ENV
from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)

ALGORITHM = "HS256"
AUDIENCE = "iris-federation-job"
TOKEN_TTL_SECONDS = 900
RENEW_BEFORE_SECONDS = TOKEN_TTL_SECONDS // 2  # the tick renews a token with less than this left
CLOCK_LEEWAY_SECONDS = 10


class JobTokenError(Exception):
    """A job token was missing, malformed, forged, expired or meant for another cluster; says which."""


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """Who a verified token speaks for: one incarnation of one job of this cluster."""

    job_key: str
    nonce: str
    expires_at_s: int


class JobTokens:
    def __init__(
        self,
        cluster: str,
        key: bytes,
        *,
        federation_url: str,
        ttl_seconds: int = TOKEN_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(key) < 32:
            raise ValueError("a job token key needs at least 32 bytes")
        self.cluster = cluster
        self.key = key
        self.federation_url = federation_url.rstrip("/")
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    def mint(self, job_key: str, nonce: str) -> str:
        now = int(self.clock())
        claims = {
            "iss": self.cluster,
            "aud": AUDIENCE,
            "sub": job_key,
            "nonce": nonce,
            "iat": now,
            "nbf": now,
            "exp": now + self.ttl_seconds,
        }
        return jwt.encode(claims, self.key, algorithm=ALGORITHM)

    def job_env(self, job_key: str, nonce: str) -> dict[str, str]:
        """What a launched job gets: where its cluster's api-server is, and its token."""
        return {FEDERATION_URL_ENV: self.federation_url, JOB_TOKEN_ENV: self.mint(job_key, nonce)}

    def verify(self, authorization: str | None) -> JobIdentity:
        """The identity behind an ``Authorization: Bearer <job token>`` header (signature, audience,
        issuer and lifetime checked; whether the incarnation is still live is the caller's check)."""
        if not authorization or not authorization.startswith("Bearer "):
            raise JobTokenError("a job's call needs an 'Authorization: Bearer <job token>' header ($IRIS_JOB_TOKEN)")
        token = authorization.removeprefix("Bearer ").strip()
        try:
            # Times are checked below against this service's clock, not PyJWT's.
            claims: dict[str, Any] = jwt.decode(
                token,
                self.key,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                issuer=self.cluster,
                options={
                    "require": ["exp", "iat", "iss", "aud", "sub"],
                    "strict_aud": True,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidIssuerError:
            raise JobTokenError(f"the job token was not issued by this cluster ({self.cluster})") from None
        except jwt.InvalidTokenError as error:
            raise JobTokenError(f"not a job token of this cluster: {error}") from None
        now = self.clock()
        if not isinstance(claims["exp"], int) or not isinstance(claims["iat"], int):
            raise JobTokenError("not a job token of this cluster: exp and iat must be integers")
        if claims["exp"] + CLOCK_LEEWAY_SECONDS < now:
            raise JobTokenError("the job token has expired: read $IRIS_JOB_TOKEN_FILE again, or renew it in time")
        if claims["iat"] - CLOCK_LEEWAY_SECONDS > now:
            raise JobTokenError("the job token was issued in the future: check this cluster's clocks")
        if claims["exp"] - claims["iat"] > self.ttl_seconds + CLOCK_LEEWAY_SECONDS:
            raise JobTokenError(f"the job token lives longer than {self.ttl_seconds} s")
        sub, nonce = claims.get("sub"), claims.get("nonce")
        if not isinstance(sub, str) or not isinstance(nonce, str) or not sub or not nonce:
            raise JobTokenError("the job token names no job incarnation")
        return JobIdentity(sub, nonce, int(claims["exp"]))

    def due_for_renewal(self, token_expires_at_s: int) -> bool:
        return token_expires_at_s - self.clock() < RENEW_BEFORE_SECONDS


def renew_token_files(
    tokens: JobTokens, jobs: Iterable[JobRecord], backend_of: Callable[[JobRecord], object | None]
) -> int:
    """Give every live job here whose backend keeps its token outside the job's environment (a file,
    a Kubernetes Secret mounted as one) a fresh token; how many.

    Run by each tick (every ``sync_interval_seconds`` while jobs are in flight), far more often than
    a token's lifetime, so a replica reading ``$IRIS_JOB_TOKEN_FILE`` always finds a valid one; a
    queued job's is renewed too, so it starts with one. A backend that can tell which tokens are
    due (``job_tokens_due``: the Kubernetes backend, in one listing) is only written those, once in
    half a token's life; the others are written every tick."""
    by_backend: dict[int, tuple[Any, list[JobRecord]]] = {}
    for job in jobs:
        if job.terminal or job.direction not in (Direction.LOCAL, Direction.RECEIVED):
            continue
        backend = backend_of(job)
        if getattr(backend, "write_job_token", None) is not None:
            by_backend.setdefault(id(backend), (backend, []))[1].append(job)
    renewed = 0
    for backend, live in by_backend.values():
        try:
            due_of = getattr(backend, "job_tokens_due", None)
            if due_of is not None:
                due = due_of([(job.job_id, job.nonce) for job in live], tokens.due_for_renewal)
                live = [job for job in live if (job.job_id, job.nonce) in due]
        except OSError as error:  # the next tick asks again, well within the tokens' lifetime
            log.warning("Could not tell which job tokens are due for renewal: %s", error)
            continue
        for job in live:
            try:
                if backend.write_job_token(job.job_id, job.nonce, tokens.mint(job.job_id, job.nonce)):
                    renewed += 1
            except OSError as error:  # the next tick tries again, well within the token's lifetime
                log.warning("Could not renew the job token of %s: %s", job.job_id, error)
    return renewed

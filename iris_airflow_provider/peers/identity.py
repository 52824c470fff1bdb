"""Signed peer identity: an EdDSA JWT minted per request by the calling cluster.

The token says who is calling (``iss`` = ``sub`` = the calling cluster's name), to whom (``aud`` =
the receiving cluster's name, as the caller configured that peer), for what (``role`` =
``federation-peer``), and is short-lived (300 s) and single-use (a random ``jti``). The receiving
cluster verifies it against the public key it configured for that peer name and its own name:
a cluster it does not know, a forged signature, an expired token or one meant for another
cluster is refused. Refusing a reused ``jti`` needs memory across requests and api-servers, so it
is the receiver's store that does it (:mod:`iris_airflow_provider.services.peer_auth`), with the
expiry :meth:`TokenVerifier.verify` returns.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ROLE = "federation-peer"
TOKEN_TTL_SECONDS = 300
CLOCK_LEEWAY_SECONDS = 30
ALGORITHM = "EdDSA"
MAX_JTI_LENGTH = 128  # a minted one is 32 hex digits; the receiver stores each until it expires
_JTI = re.compile(rf"[\x21-\x7e]{{1,{MAX_JTI_LENGTH}}}")  # printable ASCII: the store keeps it as text


class UnauthenticatedError(Exception):
    """The caller could not be identified as a configured peer; the message says why."""


def generate_keypair() -> tuple[str, str]:
    """A new Ed25519 key pair as (private PEM, public PEM)."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


def read_pem(value: str) -> str:
    """A PEM given inline, or the path of a file holding it."""
    if "-----BEGIN" in value:
        return value
    return Path(value).expanduser().read_text()


class TokenMinter:
    def __init__(self, cluster: str, private_key_pem: str, *, clock: Callable[[], float] = time.time) -> None:
        key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the federation private key must be an Ed25519 key (see `iris-federation keygen`)")
        self.cluster = cluster
        self.key = key
        self.clock = clock

    def mint(self, audience: str) -> str:
        """A token for one call to the cluster named ``audience`` (the peer's name in our cluster file)."""
        now = int(self.clock())
        claims = {
            "iss": self.cluster,
            "sub": self.cluster,
            "aud": audience,
            "role": ROLE,
            "iat": now,
            "nbf": now,
            "exp": now + TOKEN_TTL_SECONDS,
            "jti": secrets.token_hex(16),
        }
        return jwt.encode(claims, self.key, algorithm=ALGORITHM)


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token whose signature, audience and lifetime were checked; not yet checked for reuse."""

    peer: str  # the calling cluster
    jti: str
    usable_until_ms: int  # when the receiver stops accepting it (its expiry plus the clock leeway)


class TokenVerifier:
    def __init__(self, cluster: str, trusted_peers: Mapping[str, str]) -> None:
        """``cluster``: this cluster's name, the only audience accepted; ``trusted_peers``: peer
        name -> public key PEM."""
        self.cluster = cluster
        self.keys: dict[str, Ed25519PublicKey] = {}
        for name, pem in trusted_peers.items():
            key = serialization.load_pem_public_key(pem.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError(f"the public key of peer {name!r} must be an Ed25519 key")
            self.keys[name] = key

    def verify(self, authorization: str | None) -> VerifiedToken:
        """The verified token behind an ``Authorization: Bearer`` header."""
        if not authorization or not authorization.startswith("Bearer "):
            raise UnauthenticatedError("a federation call needs an 'Authorization: Bearer <token>' header")
        token = authorization.removeprefix("Bearer ").strip()
        try:
            claimed = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError as error:
            raise UnauthenticatedError(f"malformed token: {error}") from None
        issuer = claimed.get("iss")
        key = self.keys.get(issuer) if isinstance(issuer, str) else None
        if key is None:
            raise UnauthenticatedError(f"token issued by {issuer!r}, which is not a trusted federation peer here")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=self.cluster,
                issuer=issuer,
                leeway=CLOCK_LEEWAY_SECONDS,
                # strict: one audience, exactly ours (a list naming several clusters is refused).
                options={"require": ["exp", "iat", "iss", "sub", "aud", "jti"], "strict_aud": True},
            )
        except jwt.InvalidAudienceError:
            raise UnauthenticatedError(
                f"token from {issuer!r} is meant for {claimed.get('aud')!r}, not for this cluster "
                f"({self.cluster!r}): {issuer!r} must name this peer {self.cluster!r} in its cluster file"
            ) from None
        except jwt.InvalidTokenError as error:
            raise UnauthenticatedError(f"token from {issuer!r} refused: {error}") from None
        if claims.get("sub") != issuer or claims.get("role") != ROLE:
            raise UnauthenticatedError(f"token from {issuer!r} is not a federation-peer token")
        if claims["exp"] - claims["iat"] > TOKEN_TTL_SECONDS + CLOCK_LEEWAY_SECONDS:
            raise UnauthenticatedError(f"token from {issuer!r} lives longer than {TOKEN_TTL_SECONDS} s")
        jti = claims["jti"]
        if not isinstance(jti, str) or not _JTI.fullmatch(jti):
            raise UnauthenticatedError(
                f"token from {issuer!r} needs a jti of 1 to {MAX_JTI_LENGTH} printable ASCII characters"
            )
        # PyJWT refused an iat in the future, so this is at most TTL + 2 x leeway from now.
        usable_until_ms = (int(claims["exp"]) + CLOCK_LEEWAY_SECONDS) * 1000
        return VerifiedToken(str(issuer), jti, usable_until_ms)


def submitter_admitted(patterns: list[str], submitter: str) -> bool:
    """Whether ``allowed_submitters`` admits ``submitter``: ``*``, ``*@domain`` (any case) or exact."""
    for pattern in patterns:
        if pattern == "*":
            return True
        if pattern.startswith("*@"):
            if "@" in submitter and submitter.rsplit("@", 1)[1].lower() == pattern[2:].lower():
                return True
        elif pattern == submitter:
            return True
    return False

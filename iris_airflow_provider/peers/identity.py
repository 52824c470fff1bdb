"""Signed peer identity: an EdDSA JWT minted per request by the calling cluster.

The token says who is calling (``iss`` = ``sub`` = the calling cluster's name), to whom (``aud`` =
the receiving cluster's name, as the caller configured that peer), for what (``role`` =
``federation-peer``), and is short-lived (300 s) and single-use (a random ``jti``). The receiving
cluster verifies it against the public key it configured for that peer name and its own name:
a cluster it does not know, a forged signature, an expired token or one meant for another
cluster is refused. Refusing a reused ``jti`` needs memory across requests and api-servers, so it
is the receiver's store that does it (:mod:`iris_airflow_provider.services.peer_auth`), with the
expiry :meth:`TokenVerifier.verify` returns.

Keys rotate without downtime: each token names its signing key in the ``kid`` header (the key's
RFC 7638 thumbprint, the key id Airflow's own ``key_to_jwk_dict`` gives), and a receiver may trust
two keys per peer, the current and the next, while the peer switches.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

ROLE = "federation-peer"
TOKEN_TTL_SECONDS = 300
CLOCK_LEEWAY_SECONDS = 30
ALGORITHM = "EdDSA"
MAX_KEYS_PER_PEER = 2  # the current key and the next, during a rotation
MAX_JTI_LENGTH = 128  # a minted one is 32 hex digits; the receiver stores each until it expires
_JTI = re.compile(rf"[\x21-\x7e]{{1,{MAX_JTI_LENGTH}}}")  # printable ASCII: the store keeps it as text


class UnauthenticatedError(Exception):
    """The caller could not be identified as a configured peer; the message says why."""


def generate_keypair() -> tuple[str, str]:
    """A new Ed25519 key pair as (private PEM, public PEM)."""
    return pem_pair(Ed25519PrivateKey.generate())


def pem_pair(private: PrivateKeyTypes) -> tuple[str, str]:
    """A private key and its public key as (private PEM, public PEM), as the cluster file takes them."""
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


def key_id(key: Ed25519PublicKey) -> str:
    """The key's RFC 7638 JWK thumbprint (SHA-256, base64url): what its tokens carry as ``kid``."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


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
        self.kid = key_id(key.public_key())
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
        return jwt.encode(claims, self.key, algorithm=ALGORITHM, headers={"kid": self.kid})


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A token whose signature, audience and lifetime were checked; not yet checked for reuse."""

    peer: str  # the calling cluster
    jti: str
    usable_until_ms: int  # when the receiver stops accepting it (its expiry plus the clock leeway)


class TokenVerifier:
    def __init__(self, cluster: str, trusted_peers: Mapping[str, str | Sequence[str]]) -> None:
        """``cluster``: this cluster's name, the only audience accepted; ``trusted_peers``: peer
        name -> its public key PEM, or up to two during a rotation."""
        self.cluster = cluster
        self.keys: dict[str, dict[str, Ed25519PublicKey]] = {}  # peer -> key id -> key
        for name, pems in trusted_peers.items():
            pems = [pems] if isinstance(pems, str) else list(pems)
            if not 1 <= len(pems) <= MAX_KEYS_PER_PEER:
                raise ValueError(
                    f"peer {name!r} needs 1 or {MAX_KEYS_PER_PEER} public keys (the current and, during a rotation, "
                    f"the next), got {len(pems)}"
                )
            self.keys[name] = {}
            for pem in pems:
                key = serialization.load_pem_public_key(pem.encode())
                if not isinstance(key, Ed25519PublicKey):
                    raise ValueError(f"the public key of peer {name!r} must be an Ed25519 key")
                self.keys[name][key_id(key)] = key

    def verify(self, authorization: str | None) -> VerifiedToken:
        """The verified token behind an ``Authorization: Bearer`` header."""
        if not authorization or not authorization.startswith("Bearer "):
            raise UnauthenticatedError("a federation call needs an 'Authorization: Bearer <token>' header")
        token = authorization.removeprefix("Bearer ").strip()
        try:
            claimed = jwt.decode(token, options={"verify_signature": False})
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError as error:
            raise UnauthenticatedError(f"malformed token: {error}") from None
        issuer = claimed.get("iss")
        keys = self.keys.get(issuer) if isinstance(issuer, str) else None
        if keys is None or not isinstance(issuer, str):
            raise UnauthenticatedError(f"token issued by {issuer!r}, which is not a trusted federation peer here")
        if kid is None:
            candidates = list(keys.values())  # a token from before key ids: any of the peer's keys may verify it
        elif isinstance(kid, str) and kid in keys:
            candidates = [keys[kid]]
        else:
            raise UnauthenticatedError(
                f"token from {issuer!r} is signed with key {kid!r}, which is not one of its trusted keys here "
                f"({', '.join(sorted(keys))}): add its public key to federation.trusted_peers.{issuer}.public_key"
            )
        for key in candidates:
            try:
                return self._checked(self._decode(token, key, issuer, claimed), issuer)
            except jwt.InvalidSignatureError:
                continue  # another of the peer's keys may have signed it
        raise UnauthenticatedError(f"token from {issuer!r} refused: Signature verification failed")

    def _decode(self, token: str, key: Ed25519PublicKey, issuer: str, claimed: dict[str, Any]) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=self.cluster,
                issuer=issuer,
                leeway=CLOCK_LEEWAY_SECONDS,
                # strict: one audience, exactly ours (a list naming several clusters is refused).
                options={"require": ["exp", "iat", "iss", "sub", "aud", "jti"], "strict_aud": True},
            )
        except jwt.InvalidSignatureError:
            raise  # the caller tries the peer's other key
        except jwt.InvalidAudienceError:
            raise UnauthenticatedError(
                f"token from {issuer!r} is meant for {claimed.get('aud')!r}, not for this cluster "
                f"({self.cluster!r}): {issuer!r} must name this peer {self.cluster!r} in its cluster file"
            ) from None
        except jwt.InvalidTokenError as error:
            raise UnauthenticatedError(f"token from {issuer!r} refused: {error}") from None
        return claims

    def _checked(self, claims: dict[str, Any], issuer: str) -> VerifiedToken:
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

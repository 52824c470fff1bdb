"""Who is calling this cluster's peer API: a signed token meant for this cluster, used once.

The verifier checks the signature, the audience (this cluster's name) and the lifetime; the
store then records the token's ``jti`` until it expires, and a token seen before is refused, so a
captured token can be replayed neither here nor against another api-server on the same store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from iris_airflow_provider.backends.base import now_ms
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import TokenVerifier, UnauthenticatedError
from iris_airflow_provider.services.ports import SeenTokenStore
from iris_airflow_provider.store.store import TokenUse

# Unexpired tokens remembered per calling cluster. A token lives at most 330 s here and a parent
# mints one per call (heartbeat, sync, and a log read per job in flight on every tick), so this
# allows about 300 calls a second per peer: beyond that a peer is refused until its tokens expire.
MAX_LIVE_TOKENS_PER_PEER = 100_000


@dataclass(eq=False)
class PeerAuthenticator:
    verifier: TokenVerifier
    tokens: SeenTokenStore
    clock: Callable[[], int] = now_ms

    def authenticate(self, authorization: str | None) -> str:
        """The calling peer's name; raises PeerError (``unauthenticated``) for any token not
        signed by a trusted peer for this cluster, expired, or used before."""
        try:
            token = self.verifier.verify(authorization)
        except UnauthenticatedError as error:
            raise PeerError(PeerErrorCode.UNAUTHENTICATED, str(error)) from None
        use = self.tokens.use_token(
            token.peer, token.jti, token.usable_until_ms, self.clock(), max_live=MAX_LIVE_TOKENS_PER_PEER
        )
        if use is TokenUse.REUSED:
            raise PeerError(
                PeerErrorCode.UNAUTHENTICATED,
                f"token from {token.peer!r} was already used (jti {token.jti!r}); every call needs a fresh token",
            )
        if use is TokenUse.TOO_MANY:
            raise PeerError(
                PeerErrorCode.UNAVAILABLE,
                f"peer {token.peer!r} already has {MAX_LIVE_TOKENS_PER_PEER} unexpired tokens here, the most "
                "allowed: it calls too often, try again later",
            )
        return token.peer

"""Signed peer identity: which tokens a cluster accepts from its peers, and which it refuses and why.
(Refusing a reused token needs the store: tests/peers/test_single_use_tokens.py.)"""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

from iris_airflow_provider.peers.identity import (
    ROLE,
    TokenMinter,
    TokenVerifier,
    UnauthenticatedError,
    generate_keypair,
    pem_pair,
    read_pem,
    submitter_admitted,
)

MARIN_PRIVATE, MARIN_PUBLIC = generate_keypair()
OTHER_PRIVATE, OTHER_PUBLIC = generate_keypair()


@pytest.fixture
def verifier() -> TokenVerifier:
    """Cluster cw-east, trusting marin and cw-west."""
    return TokenVerifier("cw-east", {"marin": MARIN_PUBLIC, "cw-west": OTHER_PUBLIC})


def bearer(token: str) -> str:
    return f"Bearer {token}"


def hand_made(private_pem: str, **overrides: Any) -> str:
    """A token with the claims a minter would put in, some of them overridden (``None`` drops one)."""
    now = int(time.time())
    claims = {"iss": "marin", "sub": "marin", "aud": "cw-east", "role": ROLE, "iat": now, "exp": now + 300, "jti": "x"}
    claims.update(overrides)
    claims = {name: value for name, value in claims.items() if value is not None}
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return jwt.encode(claims, key, algorithm="EdDSA")  # type: ignore[arg-type]


def refusal(verifier: TokenVerifier, authorization: str | None) -> str:
    with pytest.raises(UnauthenticatedError) as caught:
        verifier.verify(authorization)
    return str(caught.value)


def test_a_minted_token_names_the_calling_cluster(verifier: TokenVerifier) -> None:
    assert verifier.verify(bearer(TokenMinter("marin", MARIN_PRIVATE).mint("cw-east"))).peer == "marin"
    assert verifier.verify(bearer(TokenMinter("cw-west", OTHER_PRIVATE).mint("cw-east"))).peer == "cw-west"


def test_every_token_is_unique_short_lived_and_for_one_receiver() -> None:
    minter = TokenMinter("marin", MARIN_PRIVATE, clock=lambda: 1_000_000)
    first, second = (jwt.decode(minter.mint("cw-east"), options={"verify_signature": False}) for _ in range(2))
    assert first["jti"] != second["jti"]
    assert first["exp"] - first["iat"] == 300 and first["aud"] == "cw-east" and first["role"] == ROLE


def test_the_verified_token_says_until_when_a_reuse_must_be_refused(verifier: TokenVerifier) -> None:
    now = int(time.time())
    token = verifier.verify(bearer(hand_made(MARIN_PRIVATE, iat=now, exp=now + 300, jti="abc")))
    assert (token.peer, token.jti) == ("marin", "abc")
    assert token.usable_until_ms == (now + 300 + 30) * 1000  # its expiry plus the clock leeway


def test_a_token_for_another_peer_is_refused_naming_both_clusters(verifier: TokenVerifier) -> None:
    for_west = TokenMinter("marin", MARIN_PRIVATE).mint("cw-west")  # marin's call to cw-west, replayed here
    says = refusal(verifier, bearer(for_west))
    assert "meant for 'cw-west', not for this cluster ('cw-east')" in says
    assert "'marin' must name this peer 'cw-east' in its cluster file" in says


@pytest.mark.parametrize(
    ("authorization", "says"),
    [
        (None, "needs an 'Authorization: Bearer <token>' header"),
        ("Basic bWFyaW46cHc=", "needs an 'Authorization: Bearer <token>' header"),
        ("Bearer not-a-jwt", "malformed token"),
    ],
)
def test_a_missing_or_malformed_token_is_refused(verifier: TokenVerifier, authorization: str | None, says: str) -> None:
    assert says in refusal(verifier, authorization)


def test_a_token_from_a_cluster_not_configured_here_is_refused(verifier: TokenVerifier) -> None:
    token = TokenMinter("stranger", generate_keypair()[0]).mint("cw-east")
    assert "'stranger', which is not a trusted federation peer here" in refusal(verifier, bearer(token))


def test_a_token_signed_with_another_clusters_key_is_refused(verifier: TokenVerifier) -> None:
    forged = TokenMinter("marin", OTHER_PRIVATE).mint("cw-east")  # cw-west pretending to be marin
    other_kid = TokenMinter("cw-west", OTHER_PRIVATE).kid
    says = refusal(verifier, bearer(forged))
    assert f"token from 'marin' is signed with key {other_kid!r}, which is not one of its trusted keys here" in says
    # Lying about the key id does not help: the key named must have signed it.
    marin_kid = TokenMinter("marin", MARIN_PRIVATE).kid
    relabelled = _resigned(forged, OTHER_PRIVATE, kid=marin_kid)
    assert "Signature verification failed" in refusal(verifier, bearer(relabelled))
    # Nor does leaving it out: then each of marin's keys is tried, and none signed it.
    assert "Signature verification failed" in refusal(verifier, bearer(_resigned(forged, OTHER_PRIVATE, kid=None)))


def _resigned(token: str, private_pem: str, *, kid: str | None) -> str:
    claims = jwt.decode(token, options={"verify_signature": False})
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    headers = {"kid": kid} if kid else None
    return jwt.encode(claims, key, algorithm="EdDSA", headers=headers)  # type: ignore[arg-type]


def test_the_key_id_is_the_one_airflow_gives_the_key() -> None:
    from airflow.api_fastapi.auth.tokens import key_to_jwk_dict

    private = serialization.load_pem_private_key(MARIN_PRIVATE.encode(), password=None)
    minter = TokenMinter("marin", MARIN_PRIVATE)
    assert minter.kid == key_to_jwk_dict(private)["kid"]  # type: ignore[arg-type]
    assert jwt.get_unverified_header(minter.mint("cw-east"))["kid"] == minter.kid


def test_a_peer_rotates_its_key_without_downtime() -> None:
    new_private, new_public = generate_keypair()
    old, new = TokenMinter("marin", MARIN_PRIVATE), TokenMinter("marin", new_private)
    # 1. The receiver trusts the peer's current key and its next one.
    during = TokenVerifier("cw-east", {"marin": [MARIN_PUBLIC, new_public]})
    assert during.verify(bearer(old.mint("cw-east"))).peer == "marin"
    # 2. The peer switches to its new key: both are accepted meanwhile, whichever api-server signs.
    assert during.verify(bearer(new.mint("cw-east"))).peer == "marin"
    # 3. The receiver drops the old key: the old one is refused, naming it.
    after = TokenVerifier("cw-east", {"marin": [new_public]})
    assert after.verify(bearer(new.mint("cw-east"))).peer == "marin"
    assert f"signed with key {old.kid!r}, which is not one of its trusted keys here ({new.kid})" in refusal(
        after, bearer(old.mint("cw-east"))
    )


@pytest.mark.parametrize("count", [0, 3])
def test_a_peer_has_one_or_two_trusted_keys(count: int) -> None:
    keys = [generate_keypair()[1] for _ in range(count)]
    with pytest.raises(ValueError, match=f"peer 'marin' needs 1 or 2 public keys .*, got {count}"):
        TokenVerifier("cw-east", {"marin": keys})


def test_an_expired_token_is_refused_beyond_the_clock_leeway(verifier: TokenVerifier) -> None:
    ten_minutes_ago = time.time() - 600
    expired = TokenMinter("marin", MARIN_PRIVATE, clock=lambda: ten_minutes_ago).mint("cw-east")
    assert "expired" in refusal(verifier, bearer(expired))
    slightly_skewed = TokenMinter("marin", MARIN_PRIVATE, clock=lambda: time.time() - 310).mint("cw-east")
    assert verifier.verify(bearer(slightly_skewed)).peer == "marin"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"aud": "airflow"}, "meant for 'airflow', not for this cluster ('cw-east')"),
        ({"aud": "federation"}, "meant for 'federation'"),  # the audience every token carried before
        ({"aud": ["cw-east", "cw-west"]}, "meant for ['cw-east', 'cw-west']"),  # one token for two peers
        ({"aud": None}, 'Token is missing the "aud" claim'),
        ({"jti": None}, 'Token is missing the "jti" claim'),
        ({"sub": "cw-west"}, "is not a federation-peer token"),
        ({"role": "admin"}, "is not a federation-peer token"),
        ({"exp": int(time.time()) + 86_400}, "lives longer than 300 s"),
        # Issued in the future, so that it would outlive what the receiver remembers.
        ({"iat": int(time.time()) + 3_600, "exp": int(time.time()) + 3_900}, "not yet valid (iat)"),
        ({"jti": ""}, "needs a jti of 1 to 128 printable ASCII characters"),
        ({"jti": "j" * 129}, "needs a jti of 1 to 128 printable ASCII characters"),
        ({"jti": "j\x00"}, "needs a jti of 1 to 128 printable ASCII characters"),  # the store keeps it
        ({"jti": 7}, "JWT ID must be a string"),
    ],
)
def test_a_token_with_the_wrong_claims_is_refused(
    verifier: TokenVerifier, overrides: dict[str, Any], says: str
) -> None:
    assert says in refusal(verifier, bearer(hand_made(MARIN_PRIVATE, **overrides)))


def test_only_ed25519_keys_are_accepted() -> None:
    private, public = pem_pair(generate_private_key(SECP256R1()))
    with pytest.raises(ValueError, match="must be an Ed25519 key"):
        TokenMinter("marin", private)
    with pytest.raises(ValueError, match="public key of peer 'marin' must be an Ed25519 key"):
        TokenVerifier("cw-east", {"marin": public})


def test_a_key_is_read_inline_or_from_a_file(tmp_path: Any) -> None:
    path = tmp_path / "marin.pub"
    path.write_text(MARIN_PUBLIC)
    assert read_pem(str(path)) == read_pem(MARIN_PUBLIC) == MARIN_PUBLIC


@pytest.mark.parametrize(
    ("patterns", "submitter", "admitted"),
    [
        (["*"], "anyone", True),
        (["*@example.com"], "alice@example.com", True),
        (["*@example.com"], "Alice@EXAMPLE.COM", True),
        (["*@EXAMPLE.com"], "alice@example.com", True),
        (["*@example.com"], "alice@example.com.evil.org", False),
        (["*@example.com"], "alice@sub.example.com", False),
        (["*@example.com"], "example.com", False),
        (["ops-bot"], "ops-bot", True),
        (["ops-bot"], "ops-bot2", False),
        (["ops-bot"], "OPS-BOT", False),
        ([], "alice@example.com", False),
        (["ops-bot", "*@example.com"], "bob@example.com", True),
    ],
)
def test_allowed_submitters(patterns: list[str], submitter: str, admitted: bool) -> None:
    assert submitter_admitted(patterns, submitter) is admitted

"""Serving endpoints' pure rules: named ports, capability tokens, their URLs and redirects."""

from __future__ import annotations

from dataclasses import replace

import jwt
import pytest

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.serving import (
    MAX_PORTS,
    ServingScope,
    TokenExpiredError,
    TokenForeignError,
    TokenInvalidError,
    TokenScopeError,
    check_public_parent,
    check_scope,
    mint_token,
    port_env,
    rewrite_location,
    serving_url,
    verify_token,
)

SECRET = b"s" * 32
SCOPE = ServingScope("cw-east", "/alice/llm", "nonce-1", "gpu", "http")
NOW = 1_800_000_000


def _job(**fields: object) -> dict[str, object]:
    return {"job_id": "/alice/llm", "command": ["python", "serve.py"], **fields}


class TestPorts:
    def test_named_ports_are_accepted_in_order(self) -> None:
        spec = parse_job(_job(ports=[{"name": "http"}, {"name": "grpc_2"}]))
        assert [p.name for p in spec.ports] == ["http", "grpc_2"]
        assert port_env({p.name: 8000 + i for i, p in enumerate(spec.ports)}) == {
            "IRIS_PORT_HTTP": "8000",
            "IRIS_PORT_GRPC_2": "8001",
        }

    def test_a_port_travels_with_the_job_to_a_peer(self) -> None:
        spec = parse_job(_job(ports=[{"name": "http"}]))
        assert "ports" not in spec.parent_only
        assert parse_job(spec.model_dump(mode="json")).ports == spec.ports

    @pytest.mark.parametrize("name", ["HTTP", "1http", "ht-tp", "", "a" * 33, "ht tp", "é"])
    def test_a_bad_name_is_refused_naming_the_field_and_the_rule(self, name: str) -> None:
        with pytest.raises(SpecError) as error:
            parse_job(_job(ports=[{"name": name}]))
        message = str(error.value)
        assert "ports[0].name" in message or "ports.0.name" in message
        assert "lowercase letters, digits or _, starting with a letter" in message

    def test_repeated_names_are_refused(self) -> None:
        with pytest.raises(SpecError, match=r"ports.*port names must be unique; repeated: http"):
            parse_job(_job(ports=[{"name": "http"}, {"name": "grpc"}, {"name": "http"}]))

    def test_the_count_is_bounded(self) -> None:
        parse_job(_job(ports=[{"name": f"p{i}"} for i in range(MAX_PORTS)]))
        with pytest.raises(SpecError, match=rf"ports.*at most {MAX_PORTS}"):
            parse_job(_job(ports=[{"name": f"p{i}"} for i in range(MAX_PORTS + 1)]))

    def test_a_port_has_only_a_name(self) -> None:
        with pytest.raises(SpecError, match=r"ports.*unknown field\(s\) number; accepted: name"):
            parse_job(_job(ports=[{"name": "http", "number": 80}]))

    def test_a_job_may_not_set_the_port_variables_itself(self) -> None:
        with pytest.raises(SpecError, match="IRIS_"):
            parse_job(_job(env={"IRIS_PORT_HTTP": "80"}))


class TestTokens:
    def test_a_minted_token_opens_its_scope_until_it_expires(self) -> None:
        token = mint_token(SECRET, SCOPE, now_s=NOW, ttl_s=60)
        assert verify_token(SECRET, token, cluster="cw-east", now_s=NOW + 59) == SCOPE
        with pytest.raises(TokenExpiredError) as expired:
            verify_token(SECRET, token, cluster="cw-east", now_s=NOW + 60)
        assert expired.value.status == 401

    def test_another_port_or_incarnation_is_out_of_scope(self) -> None:
        check_scope(SCOPE, port="http", running_nonce="nonce-1")
        with pytest.raises(TokenScopeError, match="opens port 'http', not 'admin'") as wrong_port:
            check_scope(SCOPE, port="admin", running_nonce="nonce-1")
        assert wrong_port.value.status == 403
        with pytest.raises(TokenScopeError, match="incarnation"):
            check_scope(SCOPE, port="http", running_nonce="nonce-2")
        with pytest.raises(TokenScopeError, match="incarnation"):
            check_scope(SCOPE, port="http", running_nonce=None)

    def test_a_token_of_another_cluster_is_foreign(self) -> None:
        theirs = mint_token(b"t" * 32, replace(SCOPE, cluster="cw-west"), now_s=NOW, ttl_s=60)
        with pytest.raises(TokenForeignError) as foreign:
            verify_token(SECRET, theirs, cluster="cw-east", now_s=NOW)
        assert foreign.value.status == 403

    def test_a_token_signed_with_another_secret_is_invalid(self) -> None:
        forged = mint_token(b"f" * 32, SCOPE, now_s=NOW, ttl_s=60)
        with pytest.raises(TokenInvalidError) as invalid:
            verify_token(SECRET, forged, cluster="cw-east", now_s=NOW)
        assert invalid.value.status == 401

    def test_a_tampered_token_is_invalid(self) -> None:
        token = mint_token(SECRET, SCOPE, now_s=NOW, ttl_s=60)
        header, _, signature = token.split(".")
        claims = jwt.decode(token, options={"verify_signature": False})
        other = jwt.encode({**claims, "port": "admin", "exp": NOW + 10**6}, b"x" * 32, algorithm="HS256")
        tampered = f"{header}.{other.split('.')[1]}.{signature}"
        with pytest.raises(TokenInvalidError):
            verify_token(SECRET, tampered, cluster="cw-east", now_s=NOW)

    def test_an_unsigned_token_is_invalid(self) -> None:
        claims = jwt.decode(mint_token(SECRET, SCOPE, now_s=NOW, ttl_s=60), options={"verify_signature": False})
        unsigned = jwt.encode(claims, None, algorithm="none")  # type: ignore[arg-type]
        with pytest.raises(TokenInvalidError):
            verify_token(SECRET, unsigned, cluster="cw-east", now_s=NOW)

    @pytest.mark.parametrize("garbage", ["", "cluster=cw-east", "a.b.c", "x" * 300])
    def test_garbage_is_invalid(self, garbage: str) -> None:
        with pytest.raises(TokenInvalidError):
            verify_token(SECRET, garbage, cluster="cw-east", now_s=NOW)

    def test_another_jwt_of_this_cluster_is_not_a_serving_token(self) -> None:
        other = jwt.encode({"iss": "cw-east", "exp": NOW + 60, "sub": "admin"}, SECRET, algorithm="HS256")
        with pytest.raises(TokenInvalidError, match="not a serving token"):
            verify_token(SECRET, other, cluster="cw-east", now_s=NOW)


class TestUrls:
    def test_the_direct_url_is_the_clusters_own(self) -> None:
        url = serving_url(token="T", port="http", own_url="https://cw.example.com/", cluster="cw-east")
        assert url == "https://cw.example.com/proxy/t/T/http/"

    def test_with_a_public_parent_the_url_is_the_parents_relay(self) -> None:
        url = serving_url(
            token="T",
            port="http",
            own_url="https://cw.internal",
            cluster="cw-east",
            public_parent="https://iris.oa.dev",
        )
        assert url == "https://iris.oa.dev/proxy/t/cluster=cw-east/T/http/"

    def test_a_root_relative_redirect_gets_the_prefix_the_caller_used(self) -> None:
        relayed = "/proxy/t/cluster=cw-east/T/http"
        origin = "http://127.0.0.1:9000"
        assert rewrite_location("/login?next=/", prefix=relayed, upstream_origin=origin) == f"{relayed}/login?next=/"
        assert rewrite_location(f"{origin}/done", prefix=relayed, upstream_origin=origin) == f"{relayed}/done"
        assert rewrite_location("next", prefix=relayed, upstream_origin=origin) == "next"
        assert rewrite_location("https://elsewhere.example/x", prefix=relayed, upstream_origin=origin) == (
            "https://elsewhere.example/x"
        )
        assert (
            rewrite_location("//elsewhere.example/x", prefix=relayed, upstream_origin=origin) == "//elsewhere.example/x"
        )

    @pytest.mark.parametrize(
        ("given", "expected"),
        [
            ("iris.oa.dev", "https://iris.oa.dev"),
            ("https://iris.oa.dev/", "https://iris.oa.dev"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("", ""),
        ],
    )
    def test_a_public_parent_is_an_origin(self, given: str, expected: str) -> None:
        assert check_public_parent(given) == expected

    @pytest.mark.parametrize(
        ("given", "reason"),
        [
            ("http://iris.oa.dev", "must be https://"),
            ("https://iris.oa.dev/base", "without a path"),
            ("ftp://iris.oa.dev", "origin"),
        ],
    )
    def test_a_bad_public_parent_is_refused(self, given: str, reason: str) -> None:
        with pytest.raises(ValueError, match=reason):
            check_public_parent(given)

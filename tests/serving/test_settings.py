"""The serving settings of the cluster file, and the secret that signs serving URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.identity import generate_keypair
from iris_airflow_provider.services.serving import read_secret


def test_the_defaults_mint_through_no_parent_with_a_day_long_token() -> None:
    config = parse_cluster_config({"name": "cw-east"})
    assert (config.federation.public_parent, config.serving.token_secret, config.serving.token_ttl_seconds) == (
        "",
        "",
        86400,
    )


def test_a_public_parent_is_normalized_to_its_origin() -> None:
    config = parse_cluster_config({"name": "cw-east", "federation": {"public_parent": "iris.oa.dev"}})
    assert config.federation.public_parent == "https://iris.oa.dev"


@pytest.mark.parametrize(
    ("document", "field", "reason"),
    [
        ({"federation": {"public_parent": "http://iris.oa.dev"}}, "federation.public_parent", "must be https://"),
        ({"serving": {"token_secret": "short"}}, "serving.token_secret", "at least 32 bytes"),
        ({"serving": {"token_ttl_seconds": 10}}, "serving.token_ttl_seconds", "must be >= 60"),
        ({"serving": {"secret": "x" * 40}}, "serving", "unknown field(s) secret; accepted: token_secret"),
    ],
)
def test_bad_serving_settings_are_refused_naming_the_field(document: dict, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_cluster_config({"name": "cw-east", **document})
    assert field in str(error.value) and reason in str(error.value)


def test_the_secret_is_the_configured_one_a_file_or_derived_from_the_private_key(tmp_path: Path) -> None:
    assert read_secret("x" * 32, "") == b"x" * 32
    (tmp_path / "secret").write_text("y" * 40 + "\n")
    assert read_secret(str(tmp_path / "secret"), "") == b"y" * 40
    (tmp_path / "short").write_text("y")
    with pytest.raises(ValueError, match=r"serving\.token_secret: the file .* holds fewer than 32 bytes"):
        read_secret(str(tmp_path / "short"), "")
    private, _ = generate_keypair()
    derived = read_secret("", private)
    assert derived is not None and len(derived) == 32 and private.encode() not in derived
    assert derived == read_secret("", private) != read_secret("", generate_keypair()[0])
    assert read_secret("", "") is None

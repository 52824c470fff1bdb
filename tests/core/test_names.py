"""Names of clusters, peers and backends, and ids unique within a list."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.names import check_name, unique_by


@pytest.mark.parametrize("name", ["a", "cw-h100", "us.east_1", "a" * 64])
def test_valid_names_pass_unchanged(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "A", "a b", "a/b", "a" * 65])
def test_invalid_names_name_the_rule(name: str) -> None:
    with pytest.raises(ValueError, match="must be 1-64 lowercase letters, digits"):
        check_name(name)


@dataclass
class Item:
    id: str


def test_unique_by_returns_the_list_when_ids_differ() -> None:
    items = [Item("a"), Item("b")]
    assert unique_by("id")(items) is items


def test_unique_by_names_the_key_and_every_repeated_value_once() -> None:
    with pytest.raises(PydanticCustomError) as caught:
        unique_by("id")([Item("b"), Item("a"), Item("b"), Item("a"), Item("c")])
    assert str(caught.value) == "id must be unique; repeated: a, b"

"""Names and ids: clusters, peers and backends are short, lowercase names safe in paths, labels and
URLs; the ids in a list of them are unique."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from pydantic_core import PydanticCustomError

T = TypeVar("T")
OptionalText = TypeVar("OptionalText", str, str | None)

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?")


def matching(pattern: re.Pattern[str], rule: str) -> Callable[[OptionalText], OptionalText]:
    """A pydantic field validator: the value when ``pattern`` matches all of it (or it is None, for an
    optional field), else ``ValueError`` saying it "must be <rule>" and what it got:
    ``field_validator("location")(matching(LOCATION, "a region (us-central1)"))``."""

    def check(value: OptionalText) -> OptionalText:
        if value is not None and not pattern.fullmatch(value):
            raise ValueError(f"must be {rule}, got {value!r}")
        return value

    return check


# A valid name, else ``ValueError`` naming the rule.
check_name = matching(NAME_PATTERN, "1-64 lowercase letters, digits, '.', '_' or '-'")


def unique_by(key: str) -> Callable[[list[T]], list[T]]:
    """A pydantic field validator for a list whose items' ``key`` must be unique; the error names
    the key and every repeated value: ``field_validator("peers")(unique_by("id"))``."""

    def check(items: list[T]) -> list[T]:
        counts = Counter(str(getattr(item, key)) for item in items)
        repeated = sorted(value for value, n in counts.items() if n > 1)
        if repeated:
            raise PydanticCustomError(
                "duplicate",
                "{key} must be unique; repeated: {repeated}",
                {"key": key, "repeated": ", ".join(repeated)},
            )
        return items

    return check

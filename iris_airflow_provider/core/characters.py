"""Which characters a job's text may hold.

Job text ends up in places that treat some characters specially: ``exec(2)`` stops an argument or
a variable at NUL, PostgreSQL refuses NUL in text, a terminal obeys escape sequences printed in a
log, a lone surrogate cannot be encoded as UTF-8 at all (so it fails the first write, far from the
input that carried it). Two rules cover every field:

- a *name* (job id, file name, image, env name, constraint key or value, region, variant, pin)
  holds no control character (C0, DEL, C1), no format character (zero-width and bidirectional
  overrides, which make two names look alike), no line or paragraph separator and no surrogate;
- *free text* (a command's arguments, an env value) may also hold tabs and newlines, which
  multi-line shell scripts and values need, and nothing else of the above but format characters.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

# Unicode categories refused in names: control, format, surrogate, line and paragraph separators.
_NAME_REFUSED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Free text keeps format characters (an emoji's joiner is fine in an echo) and tab and newline.
_TEXT_REFUSED = frozenset({"Cc", "Cs", "Zl", "Zp"})
_TEXT_ALLOWED = frozenset("\t\n")
_SHOWN = 3  # characters named in an error; the rest are counted


def refused_in_name(value: str) -> list[str]:
    """The characters ``value`` may not hold as a name, in order of first appearance."""
    return _refused(value, _NAME_REFUSED, frozenset())


def refused_in_text(value: str) -> list[str]:
    """The characters ``value`` may not hold as free text (tab and newline are fine)."""
    return _refused(value, _TEXT_REFUSED, _TEXT_ALLOWED)


def describe_refused(characters: list[str]) -> str:
    """``U+0000 (NUL), U+001B`` and how many more: what an error says instead of echoing them."""
    shown = ", ".join(_code(c) for c in characters[:_SHOWN])
    more = len(characters) - _SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def value_problem(refused: list[str], size: int, limit: int, unit: str) -> str | None:
    """What an error says of a value holding ``refused`` characters or ``size`` over ``limit``
    ``unit`` (``"is longer than 256 characters"``), or None if neither."""
    if refused:
        return f"holds {describe_refused(refused)}"
    if size > limit:
        return f"is longer than {limit} {unit}"
    return None


def shown_value(value: str, limit: int = 80) -> str:
    """``value`` as an error may quote it: escaped (``repr``) and cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def utf8_length(value: str) -> int:
    """Bytes in UTF-8 (what a file system, ``exec`` and the kernel's limits count)."""
    return len(value.encode("utf-8", "surrogatepass"))


def _printable(value: str) -> str:
    refused = refused_in_name(value)
    if refused:
        raise PydanticCustomError(
            "characters",
            "holds {bad}; control and format characters are not accepted",
            {"bad": describe_refused(refused)},
        )
    return value


Printable = Annotated[str, AfterValidator(_printable)]
"""A name or search text that has none of the characters refused in names: ``q: Printable``."""


def _refused(value: str, categories: frozenset[str], allowed: frozenset[str]) -> list[str]:
    found: dict[str, None] = {}
    for character in value:
        if character not in allowed and unicodedata.category(character) in categories:
            found.setdefault(character, None)
    return list(found)


def _code(character: str) -> str:
    point = ord(character)
    if point == 0:
        return "U+0000 (NUL)"
    return f"U+{point:04X}"

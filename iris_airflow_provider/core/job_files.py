"""A job's workdir files (``files``): which names and contents may travel, judged as a set.

``files`` maps a relative path to text, or to ``base64:<data>`` for bytes. Every backend writes
them under the job's working directory, so the names must make a tree that can exist there:

- a path is relative: ``/``-separated segments, none empty, ``.`` or ``..`` (nothing lands outside
  the workdir, and no two spellings name one file), and no backslash;
- no control or format character in it (``core/characters.py``);
- a segment at most 255 bytes of UTF-8 (what Linux file systems take), a path at most 1024;
- no path is a directory of another: ``a`` and ``a/b`` cannot both be, ``a`` would be a file and a
  directory at once;
- text contents are valid Unicode (no lone surrogate), ``base64:`` contents valid base64;
- at most 256 files and 10 MiB in all, decoded.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.characters import describe_refused, refused_in_name, shown_value, utf8_length
from iris_airflow_provider.core.limits import MAX_FILE_PATH_BYTES, MAX_FILE_SEGMENT_BYTES, MAX_FILES, MAX_FILES_BYTES

BASE64_PREFIX = "base64:"
_SHOWN_PROBLEMS = 5
# A content string this long cannot decode to less than the limit: refused before decoding it.
_MAX_ENCODED = len(BASE64_PREFIX) + 4 * (MAX_FILES_BYTES // 3 + 1)


def file_bytes(content: str) -> bytes:
    """A workdir file's bytes: text as UTF-8, or decoded from ``base64:<data>``."""
    if content.startswith(BASE64_PREFIX):
        try:
            return base64.b64decode(content[len(BASE64_PREFIX) :], validate=True)
        except binascii.Error:
            raise PydanticCustomError("file_base64", "content after base64: is not valid base64") from None
    try:
        return content.encode()
    except UnicodeEncodeError:
        raise PydanticCustomError("file_text", "text content holds a lone surrogate (not valid Unicode)") from None


def file_path_problem(path: str) -> str | None:
    """What is wrong with ``path`` as one file's name, or None."""
    refused = refused_in_name(path)
    if refused:
        return f"holds {describe_refused(refused)}"
    if not path or path.startswith("/"):
        return "must be a relative path inside the job's workdir"
    if "\\" in path:
        return "must use / between directories, not \\"
    segments = path.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return "must not have empty, '.' or '..' segments"
    if utf8_length(path) > MAX_FILE_PATH_BYTES:
        return f"is longer than {MAX_FILE_PATH_BYTES} bytes"
    if any(utf8_length(segment) > MAX_FILE_SEGMENT_BYTES for segment in segments):
        return f"has a segment longer than {MAX_FILE_SEGMENT_BYTES} bytes"
    return None


def check_files(files: Mapping[str, str]) -> Mapping[str, str]:
    """``files`` when every name and content may travel together, else one error naming the problems."""
    if len(files) > MAX_FILES:
        raise _too_big()
    problems = [f"{shown_value(path)}: {problem}" for path in files if (problem := file_path_problem(path))]
    if not problems:
        problems = [
            f"{shown_value(path)} is a file and a directory of {shown_value(inner)}" for path, inner in _nested(files)
        ]
    if problems:
        more = len(problems) - _SHOWN_PROBLEMS
        raise PydanticCustomError(
            "file_path",
            "{problems}{more}",
            {"problems": "; ".join(problems[:_SHOWN_PROBLEMS]), "more": f" (and {more} more)" if more > 0 else ""},
        )
    total = 0
    for content in files.values():
        if len(content) > _MAX_ENCODED:
            raise _too_big()
        total += len(file_bytes(content))
        if total > MAX_FILES_BYTES:
            raise _too_big()
    return files


def _nested(files: Mapping[str, str]) -> list[tuple[str, str]]:
    """Pairs ``(a, a/b)``: a file whose path is a directory of another file's."""
    paths = set(files)
    nested = []
    for path in sorted(paths):
        segments = path.split("/")
        for depth in range(1, len(segments)):
            directory = "/".join(segments[:depth])
            if directory in paths:
                nested.append((directory, path))
                break
    return nested


def _too_big() -> PydanticCustomError:
    return PydanticCustomError(
        "files_size",
        "at most {count} files and {size} bytes in all travel inline with a job; "
        "put larger inputs in an object store the peer can read",
        {"count": MAX_FILES, "size": MAX_FILES_BYTES},
    )

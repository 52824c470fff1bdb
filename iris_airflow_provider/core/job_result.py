"""What a job hands back: the JSON document it wrote at ``$IRIS_RESULT``, checked the same way on
every backend (at most 1 MiB, valid JSON), and carried from then on as that JSON text.

The result belongs to the incarnation (nonce) that produced it: backends read it only from a
successful run, the store keeps it beside that nonce, and a later incarnation never shows it.
Pure: the backends read the bytes and hand them in.
"""

from __future__ import annotations

import json

RESULT_ENV = "IRIS_RESULT"
MAX_RESULT_BYTES = 2**20  # 1 MiB, as the file the job writes


class ResultError(ValueError):
    """The file at ``$IRIS_RESULT`` cannot be a result; the message says why, for the job's error."""


def too_large(size: int | None = None) -> ResultError:
    """The error for a result over the limit (``size``: how large, when known)."""
    held = f"{size} bytes" if size is not None else f"more than {MAX_RESULT_BYTES} bytes"
    return ResultError(
        f"The job's result (the file at ${RESULT_ENV}) holds {held}; at most {MAX_RESULT_BYTES} bytes "
        "(1 MiB) are handed back: write a path to larger outputs (a checkpoint in an object store) instead"
    )


def parse_result(data: bytes) -> str:
    """The result as JSON text (as written, less surrounding whitespace), or ResultError naming what
    is wrong with ``data``. Kept as written rather than re-encoded: re-encoding may grow it past the
    limit it was checked against (``1E5`` becomes ``100000.0``)."""
    if len(data) > MAX_RESULT_BYTES:
        raise too_large(len(data))
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as error:
        raise ResultError(
            f"The job's result (the file at ${RESULT_ENV}) is not UTF-8 text (byte {error.start}); write JSON"
        ) from None
    except _NotJsonError as error:
        raise ResultError(f"The job's result (the file at ${RESULT_ENV}) is not valid JSON: {error}") from None
    except json.JSONDecodeError as error:
        raise ResultError(
            f"The job's result (the file at ${RESULT_ENV}) is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}"
        ) from None
    if _holds_nul(document):  # PostgreSQL's jsonb (Airflow's XCom) cannot hold one
        raise ResultError(f"The job's result (the file at ${RESULT_ENV}) holds a NUL character (\\u0000)")
    return data.decode("utf-8").strip()


class _NotJsonError(ValueError):
    pass


def _holds_nul(document: object) -> bool:
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _refuse_constant(name: str) -> None:
    raise _NotJsonError(f"{name} is not a JSON number")

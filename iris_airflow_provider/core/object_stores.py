"""Object-store paths a job names that the backend it is bound for cannot read.

There is no cross-cloud identity (seed, "Storage"): a job on a CoreWeave peer holds S3 credentials
only, so a ``gs://`` path in its environment or command fails there, often hours after it was
queued. A backend says what it can read by advertising ``object-store`` (for example ``[s3]``);
this module finds the paths of other stores in a job so the handoff can be flagged before it
happens. A backend that advertises nothing is not judged: we do not know what it can read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from iris_airflow_provider.core.model import JobSpec

OBJECT_STORE_KEY = "object-store"

# Spellings of one store's scheme, by the scheme backends advertise.
_ALIASES = {"gcs": "gs", "s3a": "s3", "s3n": "s3", "abfss": "abfs", "wasbs": "wasb", "az": "abfs"}
_SCHEMES = frozenset({"gs", "s3", "abfs", "wasb", "r2", "oss", "cos", *_ALIASES})
_URI = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://[^\s'\"]+")
_SHOWN_CHARS = 80


@dataclass(frozen=True, slots=True)
class ForeignPath:
    where: str  # "env NAME" or "command"
    uri: str
    scheme: str  # canonical (``gcs://`` is ``gs``)


def canonical_scheme(scheme: str) -> str:
    scheme = scheme.lower()
    return _ALIASES.get(scheme, scheme)


def object_store_paths(spec: JobSpec) -> list[ForeignPath]:
    """Every object-store URI in the job's environment and command, in that order."""
    found: list[ForeignPath] = []
    sources = [(f"env {name}", value) for name, value in sorted(spec.env.items())]
    sources += [("command", argument) for argument in spec.command]
    for where, text in sources:
        for match in _URI.finditer(text):
            if match.group(1).lower() in _SCHEMES:
                found.append(ForeignPath(where, match.group(0), canonical_scheme(match.group(1))))
    return found


def unreadable_paths(spec: JobSpec, advertised: Mapping[str, Sequence[object]]) -> list[ForeignPath]:
    """The job's object-store paths a backend advertising ``advertised`` cannot read ([] if it does not say)."""
    readable = {canonical_scheme(str(value)) for value in advertised.get(OBJECT_STORE_KEY, ())}
    if not readable:
        return []
    return [path for path in object_store_paths(spec) if path.scheme not in readable]


def mismatch_message(job_id: str, target: str, paths: Sequence[ForeignPath], readable: Sequence[object]) -> str:
    """A warning naming what the job reads and what ``target`` (a peer and backend) can read."""
    shown = ", ".join(f"{p.where}={_shorten(p.uri)}" for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    stores = ", ".join(f"{canonical_scheme(str(v))}://" for v in readable)
    return (
        f"Job {job_id} names object-store paths that {target} cannot read ({shown}); it reads only {stores}. "
        "Credentials do not travel with a handoff: move the data into that store or pin the job elsewhere."
    )


def _shorten(uri: str) -> str:
    return uri if len(uri) <= _SHOWN_CHARS else uri[: _SHOWN_CHARS - 3] + "..."

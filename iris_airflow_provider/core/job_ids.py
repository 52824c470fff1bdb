"""Job ids: one rule, applied wherever a job id comes in (the job model, the peer API's bodies, the
Federation page's API, the CLI, the sensor), so an id accepted anywhere works everywhere it goes.

A job id is ``/<user>/<name>`` for a root job, with one more segment per level for its children.
It becomes a directory name (the process backend), a Kubernetes annotation and, through a digest,
a Job name, an Airflow run id of the runner DAG (``/`` becomes ``~``), a URL parameter and log
lines. So it is:

- two or more ``/``-separated segments, none of them empty or ``.``;
- made of ASCII letters, digits and ``. _ - : + @``: the characters of an Airflow run id, less
  ``~`` (which stands for ``/`` in the runner's run ids), plus ``@`` for e-mail submitters; no
  space, control character or anything a shell, a URL or a file system treats specially;
- free of ``..`` anywhere: Airflow refuses it in run ids (path traversal), so an id holding it
  would be admitted by a peer and then never get its run;
- at most 512 characters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.characters import describe_refused, shown_value
from iris_airflow_provider.core.limits import MAX_JOB_ID_LENGTH
from iris_airflow_provider.core.names import NAME_PATTERN

SEGMENT_CHARACTERS = "A-Za-z0-9._:+@-"
_NOT_SEGMENT = re.compile(f"[^{SEGMENT_CHARACTERS}]")
_RUNS_NOT_SEGMENT = re.compile(f"[^{SEGMENT_CHARACTERS}]+")
_DOTS = re.compile(r"\.{2,}")
RULE = (
    "/<user>/<name>: two or more segments of ASCII letters, digits and . _ - : + @, "
    f"no '..' and no '.' segment, at most {MAX_JOB_ID_LENGTH} characters"
)
_MAX_USER_SEGMENT = 128  # of a derived id: the name keeps the rest
_DIGEST = 12


class JobIdError(ValueError):
    """An invalid job id; the message states the rule and what broke it."""


def job_id_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a job id, or None when it is a valid one."""
    if len(value) > MAX_JOB_ID_LENGTH:
        return f"it has {len(value)} characters"
    refused = list(dict.fromkeys(_NOT_SEGMENT.findall(value.replace("/", ""))))
    if refused:
        printable = [c for c in refused if c.isprintable() and not c.isspace()]
        named = describe_refused([c for c in refused if c not in printable])
        parts = [f"'{c}'" for c in printable[:3]] + ([named] if named else [])
        return f"it holds {', '.join(parts)}"
    segments = value.split("/")
    if segments[0] != "" or len(segments) < 3:
        return "it is not a path of two or more segments"
    if any(not segment for segment in segments[1:]):
        return "it has an empty segment"
    if ".." in value:
        return "it holds '..'"
    if "." in segments:
        return "it has a '.' segment"
    return None


def check_job_id(value: str) -> str:
    """``value`` when it is a valid job id, else :class:`JobIdError` stating the rule."""
    problem = job_id_problem(value)
    if problem is not None:
        raise JobIdError(f"must look like {RULE}; {problem}: {shown_value(value)}")
    return value


def _validator(check: Callable[[str], str]) -> AfterValidator:
    """``check`` as a pydantic validator: its :class:`JobIdError` becomes the field's error."""

    def validate(value: str) -> str:
        try:
            return check(value)
        except JobIdError as error:
            raise PydanticCustomError("job_id", str(error)) from None

    return AfterValidator(validate)


JobId = Annotated[str, _validator(check_job_id)]
"""A field or parameter holding a job id: ``job_id: JobId``."""


def derived_job_id(user: str, name: str) -> str:
    """A valid root job id ``/<user>/<name>`` made from any text (a submitter and a task's names).

    Characters the rule refuses become ``_`` (a run of them, one), runs of dots one dot; a part
    too long is cut and ends with a digest of the whole, so distinct inputs stay distinct.
    """
    segment = user_segment(user)
    return f"/{segment}/{_segment(name or '_', MAX_JOB_ID_LENGTH - len(segment) - 2)}"


def user_segment(user: str) -> str:
    """The job id segment a user's name becomes (their namespace): the same rule as ``derived_job_id``."""
    return _segment(user or "_", _MAX_USER_SEGMENT)


def _segment(text: str, limit: int) -> str:
    segment = _DOTS.sub(".", _RUNS_NOT_SEGMENT.sub("_", text))
    segment = "_" if segment == "." else segment
    if len(segment) <= limit:
        return segment
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{segment[: limit - _DIGEST - 1]}-{digest}"


def check_job_key(value: str) -> str:
    """``value`` when it names a job in this cluster's store: a job id, or a received job's key
    ``<peer>:<job id>`` (see :mod:`core.ownership`); else :class:`JobIdError` stating the rule."""
    peer, separator, job_id = value.partition(":/")
    if separator and not value.startswith("/"):
        if not NAME_PATTERN.fullmatch(peer):
            raise JobIdError(f"a received job's key is <peer>:{RULE}; the peer name is invalid: {shown_value(value)}")
        check_job_id("/" + job_id)
        return value
    return check_job_id(value)


JobKey = Annotated[str, _validator(check_job_key)]
"""A parameter naming a job in this cluster's store: a job id, or a received job's ``<peer>:<job id>``."""

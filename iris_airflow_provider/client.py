"""The client a running job uses to submit, wait for and cancel its children.

Python's standard library only, so it works on any job image with Python 3.11+, without Airflow
(an import-linter contract in ``pyproject.toml`` keeps Airflow out of its import graph)::

    from iris_airflow_provider.client import JobClient

    client = JobClient.from_env()          # $IRIS_FEDERATION_URL and the job's token
    a = client.submit({"job_id": "shard-0", "command": "python shard.py 0"})
    b = client.submit({"job_id": "shard-1", "command": "python shard.py 1"})
    for child in (a, b):
        done = client.wait(child.job_id)   # raises ChildFailedError when it fails or is killed
        print(done.job_id, done.state, done.result)

A child runs on this job's cluster (never on a peer), under ``<this job's id>/<name>``; it inherits
this job's env (its own env wins) and region (unless it names ``regions``; ``["*"]``: none), and is
submitted as the root job's user. Cancelling or failing a job cancels its children; a child never
outlives its parent. The client only reaches jobs of its own tree.

The token: where the backend rewrites it in a file (``$IRIS_JOB_TOKEN_FILE``: the process backend's,
or a Kubernetes Secret mounted in the pod), each call reads the file; otherwise the client trades
``$IRIS_JOB_TOKEN`` for a fresh one once half of its lifetime has passed.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

FEDERATION_URL_ENV = "IRIS_FEDERATION_URL"
JOB_TOKEN_ENV = "IRIS_JOB_TOKEN"
JOB_TOKEN_FILE_ENV = "IRIS_JOB_TOKEN_FILE"
JOB_API_PATH = "/iris/jobs/v1"


class JobClientError(Exception):
    """The cluster refused a call: ``status`` (HTTP), ``code`` and its ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class ChildRejectedError(JobClientError):
    """The child cannot run on this cluster (a child never federates); ``message`` says why."""


class ChildFailedError(Exception):
    """A child the job waited for ended without succeeding."""

    def __init__(self, child: ChildJob) -> None:
        super().__init__(f"child job {child.job_id} {child.state}: {child.error or 'no reason given'}")
        self.child = child


@dataclass(frozen=True)
class ChildJob:
    job_id: str
    state: str  # pending, accepted, running, succeeded, failed, killed, unschedulable
    terminal: bool
    exit_code: int | None = None
    error: str = ""
    result: Any = None  # what it wrote at $IRIS_RESULT, once it succeeded
    submitted_at_ms: int = 0
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    reattached: bool = field(default=False, compare=False)  # submit found it live already

    @classmethod
    def of(cls, data: dict[str, Any], reattached: bool = False) -> ChildJob:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data and name != "reattached"}
        return cls(**known, reattached=reattached)


def _expiry(token: str) -> tuple[float, float]:
    """The ``exp`` and ``iat`` of a JWT, read without verifying it (the cluster verifies it; this only
    decides when to renew)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"]), float(claims.get("iat", 0))
    except (IndexError, ValueError, KeyError, TypeError):
        return 0.0, 0.0


class JobClient:
    def __init__(self, url: str, *, token: str = "", token_file: str = "", timeout_seconds: float = 30.0) -> None:
        if not url:
            raise ValueError(f"no cluster URL: ${FEDERATION_URL_ENV} is set for jobs their cluster launched")
        if not token and not token_file:
            raise ValueError(f"no job token: ${JOB_TOKEN_ENV} (or ${JOB_TOKEN_FILE_ENV}) is set for launched jobs")
        self.base = url.rstrip("/") + JOB_API_PATH
        self.token = token
        self.token_file = token_file
        self.timeout_seconds = timeout_seconds

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **options: Any) -> JobClient:
        env = os.environ if environ is None else environ
        return cls(
            env.get(FEDERATION_URL_ENV, ""),
            token=env.get(JOB_TOKEN_ENV, ""),
            token_file=env.get(JOB_TOKEN_FILE_ENV, ""),
            **options,
        )

    # Calls -------------------------------------------------------------------------------------

    def submit(self, job: dict[str, Any]) -> ChildJob:
        """Submit a child: a job document (``command``, ``resources``, ``env`` ...) whose ``job_id``
        is the child's name. Submitting a live child's name again returns it (``reattached``)."""
        answer = self._call("POST", "/children", body=job)
        return ChildJob.of(answer["job"], reattached=bool(answer.get("reattached")))

    def get(self, job_id: str) -> ChildJob:
        """A job of this job's tree, by name (a child) or full id."""
        return ChildJob.of(self._call("GET", "/job", query={"job_id": job_id}))

    def children(self) -> list[ChildJob]:
        """Every job below this one."""
        return [ChildJob.of(job) for job in self._call("GET", "/children")]

    def wait(
        self, job_id: str, *, timeout_seconds: float | None = None, poll_seconds: float = 2.0, check: bool = True
    ) -> ChildJob:
        """Wait for a child to end; ChildFailedError unless it succeeded (with ``check``),
        TimeoutError past ``timeout_seconds``."""
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while True:
            child = self.get(job_id)
            if child.terminal:
                if check and child.state != "succeeded":
                    raise ChildFailedError(child)
                return child
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"child job {child.job_id} is still {child.state} after {timeout_seconds} s")
            time.sleep(poll_seconds)

    def cancel(self, job_id: str) -> ChildJob:
        """Cancel a job of this job's tree (and its own children); returns it as it is after the cancel."""
        return ChildJob.of(self._call("POST", "/cancel", query={"job_id": job_id})["job"])

    def renew(self) -> str:
        """Trade the current token for a fresh one (done by itself when it is needed)."""
        self.token = str(self._call("POST", "/token", renewing=True)["token"])
        return self.token

    # Plumbing ----------------------------------------------------------------------------------

    def _current_token(self) -> str:
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as handle:
                    token = handle.read().strip()
                if token:
                    return token
            except OSError:
                pass  # fall back on the token from the environment
        expires, issued = _expiry(self.token)
        if expires and time.time() > issued + (expires - issued) / 2:
            self.renew()
        return self.token

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        renewing: bool = False,
    ) -> Any:
        url = self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        token = self.token if renewing and not self.token_file else self._current_token()
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raw = error.read()[:4096].decode(errors="replace")
            try:
                detail = json.loads(raw)
                code, message = str(detail.get("code", "")), str(detail.get("message", raw))
            except (ValueError, AttributeError):
                code, message = "", raw
            refusal = ChildRejectedError if error.code == 422 else JobClientError
            raise refusal(error.code, code, message) from None

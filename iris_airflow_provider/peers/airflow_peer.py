"""A peer that is another Airflow deployment running this provider, reached over its peer HTTP API.

Every call carries a freshly minted token, signed for this peer alone and used once, and its own
timeout. Only ``https://`` is spoken unless the cluster file allows plain HTTP for this peer (tests
and local demos): a token or a job sent in the clear can be captured.

Nothing a peer answers is trusted: an answer is read up to its route's byte limit and no further,
must be JSON of the route's shape without NUL characters, and may not hold more items than were
asked for (log lines) or than the wire allows (backends, sync deltas). Anything else is a
:class:`PeerError` naming the peer and what was wrong with its answer.

Answers are classified as the seed does: ``already_exists``, ``permission_denied``,
``invalid_argument`` and ``payload_too_large`` end a handoff for good; everything else (connection
errors, timeouts, 5xx, malformed answers, ``unauthenticated``) is transient and retried by the
caller with backoff.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from iris_airflow_provider.backends.base import JobReport, LogChunk
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.availability import PeerBackend
from iris_airflow_provider.core.bundles import BundleRef, next_upload_step
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.wire import BackendSummary
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode, SyncResult, Termination
from iris_airflow_provider.peers.identity import TokenMinter
from iris_airflow_provider.peers.wire import (
    ANSWER_LIMITS,
    API_PREFIX,
    HANDOFF_BODY_LIMIT,
    MAX_BACKENDS,
    MAX_SYNC_DELTAS,
    BackendsResponse,
    BundleStatus,
    ErrorBody,
    HandoffRequest,
    HandoffResponse,
    JobStatus,
    LogsResponse,
    SyncRequest,
    SyncResponse,
    TerminateRequest,
    logs_answer_limit,
    nul_path,
)

CODE_OF_STATUS = {
    400: PeerErrorCode.INVALID_ARGUMENT,
    401: PeerErrorCode.UNAUTHENTICATED,
    403: PeerErrorCode.PERMISSION_DENIED,
    404: PeerErrorCode.NOT_FOUND,
    409: PeerErrorCode.ALREADY_EXISTS,
    412: PeerErrorCode.FAILED_PRECONDITION,
    413: PeerErrorCode.PAYLOAD_TOO_LARGE,
}
MAX_ERROR_MESSAGE_CHARS = 2_000  # a refusal's message is kept on the job: enough to say why
ERROR_ANSWER_LIMIT = 64 * 2**10

Answer = TypeVar("Answer", bound=BaseModel)


class AirflowPeer:
    kind = "airflow"

    def __init__(
        self,
        peer_id: str,
        url: str,
        minter: TokenMinter,
        *,
        timeout_seconds: float = 10.0,
        delivery_timeout_seconds: float = 180.0,
        allow_insecure_http: bool = False,
        transport: httpx.BaseTransport | None = None,
        bundles: BundleStore | None = None,
    ) -> None:
        if url.startswith("http://") and not allow_insecure_http:
            raise ValueError(
                f"peer {peer_id}: url {url!r} is plain http://, which sends tokens and jobs in the clear; "
                "use https://, or set allow_insecure_http: true on the peer (tests and local demos only)"
            )
        self.peer_id = peer_id
        self.address = url.rstrip("/")
        self.url = self.address + API_PREFIX
        self.minter = minter
        self.timeout = timeout_seconds
        self.delivery_timeout = delivery_timeout_seconds
        self.bundles = bundles  # where the workdir bundles of jobs delivered to it are read from
        self.client = httpx.Client(transport=transport, follow_redirects=False)

    def _call(
        self,
        method: str,
        path: str,
        answer: type[Answer],
        *,
        limit: int | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Answer:
        """Call ``path`` and read its answer as ``answer``, refusing more than ``limit`` bytes."""
        limit = limit or ANSWER_LIMITS[path]
        headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {self.minter.mint(self.peer_id)}"}
        try:
            with self.client.stream(
                method, self.url + path, headers=headers, timeout=timeout or self.timeout, **kwargs
            ) as response:
                ok = response.status_code == 200
                # A refusal is classified by its status whatever its body: only its start is read.
                body = self._read(response, path, limit) if ok else _start_of(response, ERROR_ANSWER_LIMIT)
        except httpx.TimeoutException as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} timed out: {error}") from error
        except httpx.TransportError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} unreachable: {error}") from error
        if ok:
            return self._parse(body, response, path, answer)
        raise self._refusal(body, response)

    def _read(self, response: httpx.Response, path: str, limit: int) -> bytes:
        """The answer's bytes (decompressed), never more than ``limit`` of them in memory."""
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise self._malformed(path, response, f"an answer of {int(declared)} bytes, more than the {limit} allowed")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise self._malformed(path, response, f"an answer of more than the {limit} bytes allowed")
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, body: bytes, response: httpx.Response, path: str, answer: type[Answer]) -> Answer:
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
            raise self._malformed(path, response, f"a body that is not JSON: {_excerpt(body)}") from None
        if (where := nul_path(document)) is not None:
            raise self._malformed(path, response, f"a NUL character in its JSON (at {where or 'the top'})")
        try:
            return answer.model_validate(document)
        except ValidationError as error:
            problems = "; ".join(str(p) for p in SpecError.from_validation_error(error).problems[:3])
            raise self._malformed(path, response, f"JSON not of the expected shape ({problems})") from None

    def _malformed(self, path: str, response: httpx.Response, what: str) -> PeerError:
        kind = response.headers.get("content-type", "no content type")
        return PeerError(
            PeerErrorCode.UNAVAILABLE,
            f"peer {self.peer_id} answered {path} with {response.status_code} ({kind}) and {what}",
        )

    def _refusal(self, body: bytes, response: httpx.Response) -> PeerError:
        try:
            error = ErrorBody.model_validate_json(body)
        except ValueError:  # not our error body: a proxy, a gateway, an older api-server
            code = CODE_OF_STATUS.get(response.status_code, PeerErrorCode.UNAVAILABLE)
            return PeerError(code, f"peer {self.peer_id} answered {response.status_code}: {_excerpt(body)}")
        message = error.message.replace("\x00", "\ufffd")
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            message = message[:MAX_ERROR_MESSAGE_CHARS] + " [cut]"
        return PeerError(error.code, message)

    # The protocol ------------------------------------------------------------------------------

    def heartbeat(self) -> list[PeerBackend]:
        body = self._call("GET", "/backends", BackendsResponse)
        if len(body.backends) > MAX_BACKENDS:
            raise PeerError(
                PeerErrorCode.UNAVAILABLE,
                f"peer {self.peer_id} advertised {len(body.backends)} backends, more than the {MAX_BACKENDS} allowed",
            )
        try:
            return [BackendSummary.model_validate(backend).to_core() for backend in body.backends]
        except ValidationError as error:
            problems = "; ".join(str(p) for p in SpecError.from_validation_error(error, "backends").problems[:3])
            raise PeerError(
                PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} advertised a malformed backend: {problems}"
            ) from None

    def deliver(self, handoff: Handoff) -> JobReport:
        """Hand the job over. A job whose workdir is a bundle is offered first: a peer that will not
        take it says so before any byte of the bundle is sent, one that has the bundle admits it at
        once, and one that lacks it answers ``failed_precondition``: the bundle is uploaded (what the
        peer does not hold yet), and the job offered again."""
        try:
            return self._offer(handoff)
        except PeerError as error:
            if handoff.spec.bundle is None or error.code is not PeerErrorCode.FAILED_PRECONDITION:
                raise
        self.upload_bundle(handoff.spec.bundle)
        return self._offer(handoff)

    def _offer(self, handoff: Handoff) -> JobReport:
        content = HandoffRequest.of(handoff).model_dump_json().encode()
        if len(content) > HANDOFF_BODY_LIMIT:  # the peer would refuse it: say so without sending it
            raise PeerError(
                PeerErrorCode.PAYLOAD_TOO_LARGE,
                f"job {handoff.job_id} is {len(content)} bytes as a handoff, more than the {HANDOFF_BODY_LIMIT} "
                "a peer accepts; put large inputs in an object store the peer can read",
            )
        body = self._call(
            "POST",
            "/handoffs",
            HandoffResponse,
            content=content,
            headers={"Content-Type": "application/json"},
            timeout=self.delivery_timeout,
        )
        return body.job.to_report()

    def upload_bundle(self, ref: BundleRef) -> BundleStatus:
        """Make the peer hold the bundle ``ref``: nothing is sent when it already has it (by digest),
        and an interrupted upload continues from the bytes the peer already has, a chunk per call."""
        if self.bundles is None or not self.bundles.has(ref):
            raise PeerError(
                PeerErrorCode.UNAVAILABLE,
                f"workdir bundle {ref.digest} is not in this cluster's bundle store (bundles.dir), so it cannot be "
                f"sent to peer {self.peer_id}",
            )
        path = f"/bundles/{ref.digest}"
        status = self._call("GET", path, BundleStatus, limit=ANSWER_LIMITS["/bundles"], params={"size": ref.size})
        chunk_bytes = max(1, min(self.bundles.chunk_bytes, status.max_chunk_bytes))
        while not status.complete:
            step = next_upload_step(status.received, ref.size, chunk_bytes)
            status = self._call(
                "PUT",
                path,
                BundleStatus,
                limit=ANSWER_LIMITS["/bundles"],
                timeout=self.delivery_timeout,
                params={"size": ref.size, "offset": step.offset},
                content=self.bundles.read_chunk(ref, step.offset, step.length),
                headers={"Content-Type": "application/octet-stream"},
            )
            if not status.complete and status.received <= step.offset:
                raise PeerError(
                    PeerErrorCode.UNAVAILABLE,
                    f"peer {self.peer_id} took none of a chunk of bundle {ref.digest} (holds {status.received} bytes)",
                )
        return status

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        body = self._call("POST", "/sync", SyncResponse, json=SyncRequest(cursor=cursor).model_dump())
        if len(body.deltas) > MAX_SYNC_DELTAS:
            raise PeerError(
                PeerErrorCode.UNAVAILABLE,
                f"peer {self.peer_id} answered a sync with {len(body.deltas)} changes, more than the "
                f"{MAX_SYNC_DELTAS} allowed",
            )
        reports = {d.job_id: d.to_report() for d in body.deltas if not d.tombstone}
        gone = {d.job_id for d in body.deltas if d.tombstone}
        if body.cursor_stale:  # a full snapshot: whatever it leaves out, the peer no longer has
            gone |= set(job_ids) - reports.keys()
        return SyncResult(reports, frozenset(gone), body.next_cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        try:
            self._call("POST", "/terminate", JobStatus, json=TerminateRequest(job_id=job_id, nonce=nonce).model_dump())
        except PeerError as error:
            if error.code is PeerErrorCode.NOT_FOUND:
                return False
            raise
        return True

    def terminate(self, job_id: str, nonce: str) -> Termination:
        try:
            status = self._call(
                "POST", "/terminate", JobStatus, json=TerminateRequest(job_id=job_id, nonce=nonce).model_dump()
            )
        except PeerError as error:
            if error.code is PeerErrorCode.NOT_FOUND:
                return Termination.NOT_FOUND
            raise
        return Termination.ENDED if status.state.terminal else Termination.STOPPING

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        body = self._call(
            "GET",
            "/logs",
            LogsResponse,
            limit=logs_answer_limit(max_lines),
            params={"job_id": job_id, "cursor": cursor, "max_lines": max_lines},
        )
        if len(body.lines) > max_lines:
            raise PeerError(
                PeerErrorCode.UNAVAILABLE,
                f"peer {self.peer_id} answered {len(body.lines)} log lines of {job_id} when at most {max_lines} "
                "were asked for",
            )
        return LogChunk(tuple(body.lines), body.next_cursor, body.truncated)


def _start_of(response: httpx.Response, limit: int) -> bytes:
    """The first ``limit`` bytes of an answer (decompressed); the rest is never read."""
    start = b""
    for chunk in response.iter_bytes():
        start += chunk[: limit - len(start)]
        if len(start) >= limit:
            break
    return start


def _excerpt(body: bytes, size: int = 300) -> str:
    return repr(body[:size].decode(errors="replace")) + (" ..." if len(body) > size else "")

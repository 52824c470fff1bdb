"""A peer that is another Airflow deployment running this provider, reached over its peer HTTP API.

Every call carries a freshly minted, signed identity token and its own timeout. Answers are
classified as the seed does: ``already_exists``, ``permission_denied`` and ``invalid_argument``
end a handoff for good; everything else (connection errors, timeouts, 5xx, ``unauthenticated``)
is transient and retried by the caller with backoff.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import ValidationError

from iris_airflow_provider.backends.base import JobReport, LogChunk
from iris_airflow_provider.core.availability import PeerBackend
from iris_airflow_provider.core.wire import BackendSummary
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode, SyncResult, Termination
from iris_airflow_provider.peers.identity import TokenMinter
from iris_airflow_provider.peers.wire import (
    API_PREFIX,
    BackendsResponse,
    ErrorBody,
    HandoffRequest,
    HandoffResponse,
    JobStatus,
    LogsResponse,
    SyncRequest,
    SyncResponse,
    TerminateRequest,
)

CODE_OF_STATUS = {
    400: PeerErrorCode.INVALID_ARGUMENT,
    401: PeerErrorCode.UNAUTHENTICATED,
    403: PeerErrorCode.PERMISSION_DENIED,
    404: PeerErrorCode.NOT_FOUND,
    409: PeerErrorCode.ALREADY_EXISTS,
}


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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.address = url.rstrip("/")
        self.url = self.address + API_PREFIX
        self.minter = minter
        self.timeout = timeout_seconds
        self.delivery_timeout = delivery_timeout_seconds
        self.client = httpx.Client(transport=transport, follow_redirects=False)

    def _call(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.minter.mint()}"}
        try:
            response = self.client.request(
                method, self.url + path, headers=headers, timeout=timeout or self.timeout, **kwargs
            )
        except httpx.TimeoutException as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} timed out: {error}") from error
        except httpx.TransportError as error:
            raise PeerError(PeerErrorCode.UNAVAILABLE, f"peer {self.peer_id} unreachable: {error}") from error
        if response.status_code == 200:
            return response.json()
        try:
            body = ErrorBody.model_validate(response.json())
            raise PeerError(body.code, body.message)
        except (ValueError, ValidationError):
            code = CODE_OF_STATUS.get(response.status_code, PeerErrorCode.UNAVAILABLE)
            raise PeerError(
                code, f"peer {self.peer_id} answered {response.status_code}: {response.text[:300]}"
            ) from None

    def heartbeat(self) -> list[PeerBackend]:
        body = BackendsResponse.model_validate(self._call("GET", "/backends"))
        return [BackendSummary.model_validate(backend).to_core() for backend in body.backends]

    def deliver(self, handoff: Handoff) -> JobReport:
        request = HandoffRequest.of(handoff)
        body = HandoffResponse.model_validate(
            self._call("POST", "/handoffs", json=request.model_dump(mode="json"), timeout=self.delivery_timeout)
        )
        return body.job.to_report()

    def sync(self, job_ids: list[str], cursor: str) -> SyncResult:
        body = SyncResponse.model_validate(self._call("POST", "/sync", json=SyncRequest(cursor=cursor).model_dump()))
        reports = {d.job_id: d.to_report() for d in body.deltas if not d.tombstone}
        gone = {d.job_id for d in body.deltas if d.tombstone}
        if body.cursor_stale:  # a full snapshot: whatever it leaves out, the peer no longer has
            gone |= set(job_ids) - reports.keys()
        return SyncResult(reports, frozenset(gone), body.next_cursor)

    def cancel(self, job_id: str, nonce: str = "") -> bool:
        try:
            self._call("POST", "/terminate", json=TerminateRequest(job_id=job_id, nonce=nonce).model_dump())
        except PeerError as error:
            if error.code is PeerErrorCode.NOT_FOUND:
                return False
            raise
        return True

    def terminate(self, job_id: str, nonce: str) -> Termination:
        try:
            body = self._call("POST", "/terminate", json=TerminateRequest(job_id=job_id, nonce=nonce).model_dump())
        except PeerError as error:
            if error.code is PeerErrorCode.NOT_FOUND:
                return Termination.NOT_FOUND
            raise
        return Termination.ENDED if JobStatus.model_validate(body).state.terminal else Termination.STOPPING

    def logs(self, job_id: str, cursor: str, max_lines: int) -> LogChunk:
        body = LogsResponse.model_validate(
            self._call("GET", "/logs", params={"job_id": job_id, "cursor": cursor, "max_lines": max_lines})
        )
        return LogChunk(tuple(body.lines), body.next_cursor, body.truncated)

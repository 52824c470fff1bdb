"""The peer HTTP API (``/iris/federation/v1``), served by the provider's plugin in the api-server.

Airflow does not protect plugin endpoints, so every call authenticates itself: an EdDSA-signed
token minted by the calling cluster, verified against the public keys this cluster configured
for its trusted peers (``federation.trusted_peers``). A peer may only read, sync and cancel the
jobs it handed off. Errors are JSON ``{"code", "message"}`` with a matching HTTP status.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse

from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.identity import UnauthenticatedError
from iris_airflow_provider.peers.wire import (
    STATUS_OF,
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
from iris_airflow_provider.services.receiver import Receiver

app = FastAPI(
    title="Iris federation peer API",
    description="Heartbeat, handoff, sync, terminate and logs between federated Airflow deployments.",
    version="1",
)


def receiver() -> Receiver:
    from iris_airflow_provider.hooks.runtime import get_receiver
    from iris_airflow_provider.operators.runner_runs import start_runner_run

    return get_receiver(start_runner_run)


def caller(authorization: Annotated[str | None, Header()] = None) -> str:
    from iris_airflow_provider.hooks.runtime import get_verifier

    try:
        return get_verifier().verify(authorization)
    except UnauthenticatedError as error:
        raise PeerError(PeerErrorCode.UNAUTHENTICATED, str(error)) from None


Caller = Annotated[str, Depends(caller)]
ReceiverDep = Annotated[Receiver, Depends(receiver)]


@app.exception_handler(PeerError)
async def _peer_error(_request: Request, error: PeerError) -> JSONResponse:
    body = ErrorBody(code=error.code, message=error.message)
    return JSONResponse(status_code=STATUS_OF[error.code], content=body.model_dump(mode="json"))


@app.get("/backends")
def backends(_caller: Caller, receiving: ReceiverDep) -> BackendsResponse:
    """The capability heartbeat: each backend's id, kind, advertised attributes and availability."""
    return receiving.describe()


@app.post("/handoffs")
def handoff(request: HandoffRequest, peer: Caller, receiving: ReceiverDep) -> HandoffResponse:
    """Admit a whole root job under the parent's job id (idempotent by requester and nonce)."""
    return receiving.handoff(peer, request)


@app.post("/sync")
def sync(request: SyncRequest, peer: Caller, receiving: ReceiverDep) -> SyncResponse:
    """What changed on the caller's jobs since ``cursor`` (everything when the cursor is stale)."""
    return receiving.sync(peer, request.cursor)


@app.post("/terminate")
def terminate(request: TerminateRequest, peer: Caller, receiving: ReceiverDep) -> JobStatus:
    """Cancel a job the caller handed off (only incarnation ``nonce``, when given); a finished one is re-reported."""
    return receiving.terminate(peer, request.job_id, request.nonce)


@app.get("/logs")
def logs(
    peer: Caller,
    receiving: ReceiverDep,
    job_id: Annotated[str, Query(min_length=1)],
    cursor: str = "",
    max_lines: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> LogsResponse:
    """New output lines of a job the caller handed off, after ``cursor``."""
    return receiving.logs(peer, job_id, cursor, max_lines)

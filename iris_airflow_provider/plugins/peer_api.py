"""The peer HTTP API (``/iris/federation/v1``), served by the provider's plugin in the api-server.

Airflow does not protect plugin endpoints, so every call authenticates itself: an EdDSA-signed
token minted by the calling cluster for this cluster, verified against the public keys this
cluster configured for its trusted peers (``federation.trusted_peers``), and used once. A peer may
only read, sync and cancel the jobs it handed off.

Nothing is read before the caller is authenticated: the routes declare no body, so FastAPI does
not read one; each route authenticates, then reads its body up to its limit (``BODY_LIMITS``:
a handoff carries workdir files, a sync or a terminate a few ids) and parses it. A workdir bundle
(``/bundles/{digest}``) arrives in chunks of at most ``bundles.chunk_bytes``, each streamed to
disk as it is read (``backends/bundles.py``): ``GET`` says how much is here (all of it: nothing to
send), ``PUT`` appends the next chunk, and the last one is verified against the digest; a bundle
none of which is here yet is refused (``resource_exhausted``) when the store has no room for it
under ``bundles.max_total_bytes``. The OpenAPI
document is served to authenticated peers only (``/openapi.json``), and there is no ``/docs``
page. Errors are JSON ``{"code", "message"}`` with a matching HTTP status: bad input is a 400
naming the field, an over-long body a 413, never a 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from fastapi import Depends, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from iris_airflow_provider.backends.base import MalformedCursorError
from iris_airflow_provider.backends.bundles import BundleStore, UploadConflictError
from iris_airflow_provider.core.bundles import BundleError, BundleRef
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.base import PeerError, PeerErrorCode
from iris_airflow_provider.peers.wire import (
    BODY_LIMITS,
    MAX_LOG_LINES,
    STATUS_OF,
    BackendsResponse,
    BundleStatus,
    ErrorBody,
    HandoffRequest,
    HandoffResponse,
    JobIdText,
    JobStatus,
    LogCursor,
    LogsResponse,
    SyncRequest,
    SyncResponse,
    TerminateRequest,
)
from iris_airflow_provider.plugins.private_app import private_app
from iris_airflow_provider.plugins.request_body import BodyTooLargeError, documented_body, read_body
from iris_airflow_provider.services.receiver import Receiver

app = private_app(
    "Iris federation peer API",
    "Heartbeat, handoff, sync, terminate and logs between federated Airflow deployments.",
)

Body = TypeVar("Body", bound=BaseModel)


def receiver() -> Receiver:
    from iris_airflow_provider.hooks.runtime import get_receiver
    from iris_airflow_provider.hooks.serving import minted_urls
    from iris_airflow_provider.operators.runner_runs import start_runner_run

    return get_receiver(start_runner_run, minted_urls)


def caller(authorization: Annotated[str | None, Header()] = None) -> str:
    from iris_airflow_provider.hooks.runtime import get_peer_authenticator

    return get_peer_authenticator().authenticate(authorization)


Caller = Annotated[str, Depends(caller)]
ReceiverDep = Annotated[Receiver, Depends(receiver)]


def json_body(model: type[Body], path: str) -> Callable[..., Awaitable[Body]]:
    """A dependency reading the body of ``path`` as ``model``, once the caller is authenticated."""

    async def read(_peer: Caller, request: Request) -> Body:
        raw = await read_body(request, BODY_LIMITS[path])
        try:
            return model.model_validate_json(raw)
        except ValidationError as error:
            raise PeerError(PeerErrorCode.INVALID_ARGUMENT, _problems(error, "body")) from None

    return read


def _problems(error: ValidationError, prefix: str = "") -> str:
    return "; ".join(str(problem) for problem in SpecError.from_validation_error(error, prefix).problems[:5])


def _error(code: PeerErrorCode, message: str) -> JSONResponse:
    body = ErrorBody(code=code, message=message)
    return JSONResponse(status_code=STATUS_OF[code], content=body.model_dump(mode="json"))


@app.exception_handler(PeerError)
async def _peer_error(_request: Request, error: PeerError) -> JSONResponse:
    return _error(error.code, error.message)


@app.exception_handler(RequestValidationError)
async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
    """A bad query parameter: ``job_id: must not contain control characters``, a 400."""
    # FastAPI locates a parameter as ("query", "job_id"): name the parameter alone.
    located = [{**problem, "loc": tuple(problem.get("loc", ()))[1:]} for problem in error.errors()]
    problems = SpecError.from_errors(located).problems[:5]
    return _error(PeerErrorCode.INVALID_ARGUMENT, "; ".join(str(problem) for problem in problems))


@app.exception_handler(HTTPException)
async def _http(_request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's own refusals (an unknown path, a wrong method) in this API's error shape."""
    code = PeerErrorCode.NOT_FOUND if error.status_code == 404 else PeerErrorCode.INVALID_ARGUMENT
    body = ErrorBody(code=code, message=str(error.detail))
    return JSONResponse(status_code=error.status_code, content=body.model_dump(mode="json"), headers=error.headers)


@app.exception_handler(BodyTooLargeError)
async def _too_large(_request: Request, error: BodyTooLargeError) -> JSONResponse:
    return _error(PeerErrorCode.PAYLOAD_TOO_LARGE, str(error))


@app.exception_handler(MalformedCursorError)
async def _bad_cursor(_request: Request, error: MalformedCursorError) -> JSONResponse:
    return _error(PeerErrorCode.INVALID_ARGUMENT, str(error))


@app.get("/openapi.json", include_in_schema=False)
def openapi(_caller: Caller) -> dict[str, Any]:
    """This API's OpenAPI document, for a peer (or a fuzzer holding a peer's key)."""
    return app.openapi()


@app.get("/backends")
def backends(_caller: Caller, receiving: ReceiverDep) -> BackendsResponse:
    """The capability heartbeat: each backend's id, kind, advertised attributes and availability."""
    return receiving.describe()


HandoffBody = Annotated[HandoffRequest, Depends(json_body(HandoffRequest, "/handoffs"))]
SyncBody = Annotated[SyncRequest, Depends(json_body(SyncRequest, "/sync"))]
TerminateBody = Annotated[TerminateRequest, Depends(json_body(TerminateRequest, "/terminate"))]


@app.post("/handoffs", openapi_extra=documented_body(HandoffRequest))
def handoff(request: HandoffBody, peer: Caller, receiving: ReceiverDep) -> HandoffResponse:
    """Admit a whole root job under the parent's job id (idempotent by requester and nonce)."""
    return receiving.handoff(peer, request)


@app.post("/sync", openapi_extra=documented_body(SyncRequest))
def sync(request: SyncBody, peer: Caller, receiving: ReceiverDep) -> SyncResponse:
    """What changed on the caller's jobs since ``cursor`` (everything when the cursor is stale)."""
    return receiving.sync(peer, request.cursor)


@app.post("/terminate", openapi_extra=documented_body(TerminateRequest))
def terminate(request: TerminateBody, peer: Caller, receiving: ReceiverDep) -> JobStatus:
    """Cancel a job the caller handed off (only incarnation ``nonce``, when given); a finished one is re-reported."""
    return receiving.terminate(peer, request.job_id, request.nonce)


def bundle_store() -> BundleStore:
    from iris_airflow_provider.hooks.runtime import get_bundle_store

    return get_bundle_store()


Bundles = Annotated[BundleStore, Depends(bundle_store)]
DigestPath = Annotated[str, Path(max_length=71, description="sha256:<hex> of the bundle")]
BundleSize = Annotated[int, Query(ge=1, description="the bundle's size in bytes")]


def _bundle(digest: str, size: int, bundles: BundleStore) -> BundleRef:
    """The bundle named by the path and query, if this cluster takes one that large."""
    try:
        ref = BundleRef(digest=digest, size=size)
    except ValidationError as error:
        raise PeerError(PeerErrorCode.INVALID_ARGUMENT, _problems(error)) from None
    if ref.size > bundles.max_bundle_bytes:  # not here, maybe elsewhere: the parent requeues the job
        raise PeerError(
            PeerErrorCode.RESOURCE_EXHAUSTED,
            f"bundle {ref.digest} is {ref.size} bytes, more than the {bundles.max_bundle_bytes} this cluster "
            "takes (bundles.max_bundle_bytes)",
        )
    return ref


def _bundle_status(ref: BundleRef, bundles: BundleStore) -> BundleStatus:
    received = bundles.received(ref)
    return BundleStatus(
        digest=ref.digest,
        size=ref.size,
        received=received,
        complete=bundles.has(ref),
        max_chunk_bytes=bundles.chunk_bytes,
    )


@app.get("/bundles/{digest}")
def bundle_status(
    digest: DigestPath, size: BundleSize, _peer: Caller, bundles: Bundles, receiving: ReceiverDep
) -> BundleStatus:
    """How much of a workdir bundle this cluster holds (``complete``: all, nothing to send); a bundle
    none of which is here and for which the store has no room is refused (``resource_exhausted``)."""
    ref = _bundle(digest, size, bundles)
    receiving.admit_bundle_upload(ref)
    return _bundle_status(ref, bundles)


@app.put("/bundles/{digest}", openapi_extra={"requestBody": {"content": {"application/octet-stream": {}}}})
async def upload_bundle_chunk(
    digest: DigestPath,
    size: BundleSize,
    offset: Annotated[int, Query(ge=0, description="where the chunk starts: the bytes this cluster holds")],
    _peer: Caller,
    bundles: Bundles,
    receiving: ReceiverDep,
    request: Request,
) -> BundleStatus:
    """Append the next chunk of a workdir bundle, streamed to disk; the last one is verified against
    the digest (a mismatch discards the upload). A cut connection keeps what arrived."""
    ref = _bundle(digest, size, bundles)
    if bundles.has(ref):
        return _bundle_status(ref, bundles)  # already here: nothing is read
    declared = request.headers.get("content-length", "")
    if not declared.isdigit():
        raise PeerError(PeerErrorCode.INVALID_ARGUMENT, "a bundle chunk needs a Content-Length header")
    length = int(declared)
    if length > bundles.chunk_bytes:
        raise BodyTooLargeError(f"{request.method} {request.url.path}", bundles.chunk_bytes)
    await anyio.to_thread.run_sync(receiving.admit_bundle_upload, ref)
    try:
        with bundles.upload(ref, offset, length) as upload:
            async for chunk in request.stream():
                upload.write(chunk)
        if upload.received == ref.size:
            await anyio.to_thread.run_sync(bundles.complete, ref)
    except UploadConflictError as error:  # another writer, or a stale offset: ask again where it stands
        raise PeerError(PeerErrorCode.UNAVAILABLE, str(error)) from None
    except BundleError as error:  # a chunk longer than announced, or a digest mismatch (discarded)
        raise PeerError(PeerErrorCode.UNAVAILABLE, str(error)) from None
    return _bundle_status(ref, bundles)


@app.get("/logs")
def logs(
    peer: Caller,
    receiving: ReceiverDep,
    job_id: Annotated[JobIdText, Query()],
    cursor: Annotated[LogCursor, Query()] = "",
    max_lines: Annotated[int, Query(ge=1, le=MAX_LOG_LINES)] = 1000,
) -> LogsResponse:
    """New output lines of a job the caller handed off, after ``cursor``."""
    return receiving.logs(peer, job_id, cursor, max_lines)

"""The job API (``/iris/jobs/v1``): what a running job of this cluster may ask of it, with its job
token (``$IRIS_JOB_TOKEN``, see ``services/job_tokens.py``): submit children, read and wait for
them, cancel them, renew its token. ``iris_airflow_provider.client`` is its client.

A job is authenticated by its token alone, never by where it calls from, and acts on its own tree
only. As in the peer API, nothing is read before the caller is authenticated (the routes declare no
body), a body is bounded before it is parsed, and errors are JSON ``{"code", "message"}``: 401 for
a missing, forged, expired or finished job's token, 403 for a job outside the caller's tree, 400
naming every bad field, 409 when the caller is ending or being cancelled, 422 when the child cannot
run on this cluster (the router's reason: a child never federates), 413 for an over-long body.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.peers.wire import HANDOFF_BODY_LIMIT, JobIdText
from iris_airflow_provider.plugins.private_app import private_app
from iris_airflow_provider.plugins.request_body import BodyTooLargeError, read_body
from iris_airflow_provider.services.children import ChildJobs, NotInTreeError
from iris_airflow_provider.services.job_tokens import JobTokenError
from iris_airflow_provider.store.records import JobRecord
from iris_airflow_provider.store.trees import ParentNotLiveError

JOB_API_PREFIX = "/iris/jobs/v1"

app = private_app("Iris federation job API", "What a running job may ask of its cluster: its children.")


class ChildJob(BaseModel):
    """A job of the caller's tree, under the id its tree knows it by."""

    job_id: str
    state: str
    terminal: bool
    exit_code: int | None = None
    error: str = ""
    result: Any = None  # what it handed back at $IRIS_RESULT (JSON), once it succeeded
    submitted_at_ms: int
    started_at_ms: int | None = None
    finished_at_ms: int | None = None


class SubmitAnswer(BaseModel):
    job: ChildJob
    reattached: bool  # a live child of that id already existed: nothing new was submitted


class CancelAnswerBody(BaseModel):
    result: str  # cancelled, cancel_requested, already_finished
    message: str
    job: ChildJob


class TokenAnswer(BaseModel):
    token: str


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"code": code, "message": message})


# Each refusal a route raises, as the status and code of its JSON error (its message is the error's).
_REFUSALS: dict[type[Exception], tuple[int, str]] = {
    JobTokenError: (401, "UNAUTHENTICATED"),
    NotInTreeError: (403, "PERMISSION_DENIED"),
    SpecError: (400, "INVALID_ARGUMENT"),
    ParentNotLiveError: (409, "FAILED_PRECONDITION"),
    BodyTooLargeError: (413, "PAYLOAD_TOO_LARGE"),
}


def _refusal_handler(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(_request: Request, error: Exception) -> JSONResponse:
        return _error(status, code, str(error))

    return handle


for _refused, (_status, _code) in _REFUSALS.items():
    app.add_exception_handler(_refused, _refusal_handler(_status, _code))


@app.exception_handler(KeyError)
async def _missing(_request: Request, error: KeyError) -> JSONResponse:
    return _error(404, "NOT_FOUND", str(error.args[0]) if error.args else "not found")


@app.exception_handler(RequestValidationError)
async def _invalid_query(_request: Request, error: RequestValidationError) -> JSONResponse:
    located = [{**problem, "loc": tuple(problem.get("loc", ()))[1:]} for problem in error.errors()]
    return _error(400, "INVALID_ARGUMENT", str(SpecError.from_errors(located)))


def children() -> ChildJobs:
    from iris_airflow_provider.hooks.runtime import get_federation

    service = get_federation().children
    if service is None:  # pragma: no cover - the runtime always builds it with job tokens
        raise JobTokenError("this cluster issues no job tokens")
    return service


ChildrenDep = Annotated[ChildJobs, Depends(children)]


def caller(service: ChildrenDep, authorization: Annotated[str | None, Header()] = None) -> JobRecord:
    return service.caller(authorization)


Caller = Annotated[JobRecord, Depends(caller)]


def _view(service: ChildJobs, job: JobRecord) -> ChildJob:
    text = service.result(job)
    return ChildJob(
        job_id=job.job_spec.job_id,
        state=job.state.value,
        terminal=job.terminal,
        exit_code=job.exit_code,
        error=job.error,
        result=json.loads(text) if text else None,
        submitted_at_ms=job.submitted_at_ms,
        started_at_ms=job.started_at_ms,
        finished_at_ms=job.finished_at_ms,
    )


class UnschedulableError(Exception):
    """The child cannot run on this cluster; the router's reason."""


@app.exception_handler(UnschedulableError)
async def _unschedulable(_request: Request, error: UnschedulableError) -> JSONResponse:
    return _error(422, "UNSCHEDULABLE", str(error))


@app.post("/children", status_code=201)
async def submit_child(me: Caller, service: ChildrenDep, request: Request, response: Response) -> SubmitAnswer:
    """Submit a child of the calling job (the body: a job document whose ``job_id`` is the child's
    name); 201, or 200 when a live child of that name already existed (nothing new was submitted)."""
    raw = await read_body(request, HANDOFF_BODY_LIMIT)
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise SpecError.single("body", f"must be a JSON job object: {error}") from None
    submitted = service.submit(me, document)
    if submitted.job is None:
        raise UnschedulableError(submitted.decision.reason)
    if submitted.reattached:
        response.status_code = 200
    return SubmitAnswer(job=_view(service, submitted.job), reattached=submitted.reattached)


@app.get("/children")
def list_children(me: Caller, service: ChildrenDep) -> list[ChildJob]:
    """Every job below the calling job: its children, theirs, and so on."""
    return [_view(service, job) for job in service.tree(me)]


@app.get("/job")
def get_child(me: Caller, service: ChildrenDep, job_id: Annotated[JobIdText, Query()]) -> ChildJob:
    """A job of the caller's tree, by its id or its name under the caller."""
    return _view(service, service.child(me, job_id))


@app.post("/cancel")
def cancel_child(me: Caller, service: ChildrenDep, job_id: Annotated[JobIdText, Query()]) -> CancelAnswerBody:
    """Cancel a job of the caller's tree, and its own tree."""
    answer = service.cancel(me, job_id)
    assert answer.job is not None
    return CancelAnswerBody(result=answer.result, message=answer.message, job=_view(service, answer.job))


@app.post("/token")
def renew_token(me: Caller, service: ChildrenDep) -> TokenAnswer:
    """A fresh token for the calling job, while it is live (for backends that do not rewrite
    ``$IRIS_JOB_TOKEN_FILE``)."""
    return TokenAnswer(token=service.renew(me))

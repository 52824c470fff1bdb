"""The Federation page's JSON API and static bundle, served by the plugin under ``/iris/federation/ui``.

- ``GET  api/peers``: the seed's list-peers shape, plus local backends and the fleet summary;
- ``GET  api/jobs``: jobs newest first, filtered (``state``, ``direction``, ``peer``, ``submitter``,
  ``dag_id``, ``q``, ``active``) and paged (``limit``, ``offset``), with the total and the filters' choices;
- ``GET  api/jobs/describe?job_id=``: a job, its history and pending reasons, its output tail;
- ``GET  api/jobs/explain?job_id=``: why it waits, peer by peer and backend by backend;
- ``POST api/jobs/cancel?job_id=``: cancel it (through the federation service);
- ``GET  static/...``: the page (``federation-page.js``), loaded by the Airflow UI.

Airflow does not protect plugin endpoints, so every API call authenticates itself with an Airflow
token, through Airflow's own API dependency (``get_user``): the ``Authorization: Bearer`` header
(scripts), else the ``_token`` cookie the Airflow UI signs in with (the page; it is HttpOnly, so
the page cannot read it and the browser sends it). Its answers are Airflow's: 401 ``Not
authenticated`` or ``Token Expired``, 403 ``Invalid JWT token``.
Authorization is Airflow's auth manager's, per job, on the DAG it belongs to
(:func:`~iris_airflow_provider.plugins.job_documents.job_dag`): reading needs ``GET`` on the DAG's task
instances, cancelling ``PUT`` (what marking its task failed needs). A job with no DAG needs the
same on all DAGs, asked DAG by DAG. A job the caller may not read is answered exactly as a job that
does not exist (404), so its id's existence is not disclosed either.
A cookie-authenticated cancel must also carry the ``X-Iris-Federation`` header,
which a cross-site form cannot send (CSRF). Errors are ``{"detail": "<message>"}``; a bad
parameter (out of range, unknown, or holding a control character such as NUL) is a 422 whose
message starts with the parameter's name, never a 500.

No route takes a body (cancel's job id is a query parameter), so nothing is read before the caller
is authenticated. The API's description is for signed-in users only: ``openapi.json`` and the
``docs`` page need the same Airflow token or cookie as the API.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from iris_airflow_provider.backends.base import now_ms
from iris_airflow_provider.core.characters import Printable
from iris_airflow_provider.core.job_ids import JobKey as ValidJobId
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.plugins.job_documents import job_dag
from iris_airflow_provider.plugins.private_app import private_app
from iris_airflow_provider.services.federation import Federation
from iris_airflow_provider.store.queries import JobFilter, JobScope, MonitoringQueries
from iris_airflow_provider.store.records import JobRecord

log = logging.getLogger(__name__)

UI_PREFIX = "/iris/federation/ui"
STATIC_DIR = Path(__file__).parent / "static"
BUNDLE = "federation-page.js"
COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN
CSRF_HEADER = "X-Iris-Federation"
MAX_LIMIT = 500
MAX_OFFSET = 10_000_000

Method = Literal["GET", "PUT"]


def bundle_url() -> str:
    """The page's URL relative to the UI's base href, versioned by content so browsers never run a stale one."""
    digest = hashlib.sha256((STATIC_DIR / BUNDLE).read_bytes()).hexdigest()[:12]
    return f"{UI_PREFIX.lstrip('/')}/static/{BUNDLE}?v={digest}"


app = private_app(
    "Iris federation UI API",
    "Peers, jobs, explanations and cancel for the Federation page and scripts (Airflow token required).",
)
app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


@app.exception_handler(RequestValidationError)
async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
    """``limit: Input should be less than or equal to 500``: the parameter first, never a 500."""
    messages = []
    for problem in error.errors():
        location = [str(part) for part in problem.get("loc", ()) if part not in ("query", "body", "header")]
        messages.append(f"{'.'.join(location) or 'request'}: {problem.get('msg', 'invalid')}")
    return JSONResponse(status_code=422, content={"detail": "; ".join(messages)})


# Authentication and authorization ------------------------------------------------------------------


@dataclass
class Caller:
    user: Any  # the auth manager's user
    via_cookie: bool
    _decisions: dict[tuple[str, str | None], bool] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.user.get_name())

    def may(self, method: Method, dag_id: str | None) -> bool:
        """Whether the auth manager lets this user act (``GET``/``PUT``) on task instances of ``dag_id``
        (``None``: of every DAG).

        Every DAG is asked one by one: what a question naming no DAG means is the auth manager's
        to decide, and FAB's answers whether the user may act on *some* DAG (a user allowed on
        one DAG would pass it and see every job).
        """
        key = (method, dag_id)
        if key not in self._decisions:
            if dag_id is None:
                self._decisions[key] = all(self.may(method, each) for each in _every_dag_id())
                return self._decisions[key]
            from airflow.api_fastapi.app import get_auth_manager
            from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

            details = DagDetails(id=dag_id, team_name=_team_of(dag_id))
            self._decisions[key] = bool(
                get_auth_manager().is_authorized_dag(
                    method=method, access_entity=DagAccessEntity.TASK_INSTANCE, details=details, user=self.user
                )
            )
        return self._decisions[key]

    def may_job(self, method: Method, job: JobRecord) -> bool:
        return self.may(method, job_dag(job))

    def scope(self, method: Method, queries: MonitoringQueries) -> JobScope:
        if self.may(method, None):
            return JobScope.everything()
        dag_ids = [*queries.origin_dag_ids(), RUNNER_DAG_ID]
        return JobScope(
            frozenset(d for d in dag_ids if self.may(method, d)), dagless=False, received_dag_id=RUNNER_DAG_ID
        )

    def may_view_capacity(self) -> bool:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import AccessView

        return bool(get_auth_manager().is_authorized_view(access_view=AccessView.CLUSTER_ACTIVITY, user=self.user))


def _every_dag_id() -> set[str]:
    """Every DAG this deployment knows (from Airflow's database, which the api-server reads), and the
    runner DAG of received jobs, so the set is never empty."""
    import sqlalchemy as sa
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return {RUNNER_DAG_ID, *session.scalars(sa.select(DagModel.dag_id))}


def _team_of(dag_id: str) -> str | None:
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None  # the common case: no metadata-database round trip per DAG
    from airflow.models.dag import DagModel

    return DagModel.get_team_name(dag_id)


async def caller(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]
) -> Caller:
    """The Airflow user behind the request, as Airflow's own API finds it (``get_user``, what
    ``GetUserDep`` resolves): the bearer token, else the UI's session cookie."""
    # Imported here: the plugin module loads while Airflow's API app is being built.
    from airflow.api_fastapi.core_api.security import get_user

    user = await get_user(request, None, bearer)
    return Caller(user, via_cookie=bearer is None or bearer.scheme.lower() != "bearer")


CallerDep = Annotated[Caller, Depends(caller)]


def federation() -> Federation:
    from iris_airflow_provider.hooks.runtime import get_federation

    return get_federation()


FederationDep = Annotated[Federation, Depends(federation)]
JobId = Annotated[ValidJobId, Query(description="the job id, e.g. /alice/train.run.manual__...")]


def _job(fed: Federation, job_id: str, who: Caller, method: Method) -> JobRecord:
    job = fed.store.get_job(job_id)
    if job is not None and not who.may_job("GET", job):
        log.info("Federation page: %s may not read job %s; answered as not found", who.name, job_id)
        job = None  # the same answer as for an id nobody uses: nothing says whether the job exists
    if job is None:
        raise HTTPException(404, f"Job {job_id} not found")
    if method != "GET" and not who.may_job(method, job):
        dag = job_dag(job)
        where = f"DAG {dag}" if dag else "every DAG (the job has none)"
        raise HTTPException(403, f"{who.name} may not cancel job {job_id}: that needs edit access to {where}")
    return job


def _enum_list(name: str, raw: list[str] | None, enum: type[JobState] | type[Direction]) -> tuple[Any, ...]:
    """Repeated or comma-separated values (``state=pending&state=running`` or ``state=pending,running``)."""
    values = [part.strip() for item in raw or [] for part in item.split(",") if part.strip()]
    accepted = [member.value for member in enum]
    unknown = [value for value in values if value not in accepted]
    if unknown:
        raise HTTPException(422, f"{name}: unknown value {unknown[0]!r}; accepted: {', '.join(accepted)}")
    return tuple(enum(value) for value in dict.fromkeys(values))


# Endpoints ---------------------------------------------------------------------------------------------


@app.get("/openapi.json", include_in_schema=False)
def openapi(_who: CallerDep) -> dict[str, Any]:
    return app.openapi()


@app.get("/docs", include_in_schema=False)
def docs(_who: CallerDep, request: Request) -> HTMLResponse:
    """The API's Swagger page; it fetches ``openapi.json`` with the same sign-in (the UI's cookie)."""
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{app.title} - docs")


@app.get("/api/peers")
def peers(who: CallerDep, fed: FederationDep) -> dict[str, Any]:
    """Reachability, heartbeat age, advertised attributes and capacity of every peer and local backend."""
    from iris_airflow_provider.services.peer_views import peers_overview

    if not who.may_view_capacity():
        raise HTTPException(403, f"{who.name} may not view cluster capacity")
    return peers_overview(fed, now_ms())


@app.get("/api/jobs")
def jobs(
    who: CallerDep,
    fed: FederationDep,
    state: Annotated[list[str] | None, Query(description="job states, repeated or comma-separated")] = None,
    direction: Annotated[list[str] | None, Query(description="local, sent or received")] = None,
    peer: Annotated[Printable | None, Query(max_length=200, description="peer id ('' for none)")] = None,
    submitter: Annotated[Printable | None, Query(max_length=300)] = None,
    dag_id: Annotated[Printable | None, Query(max_length=250)] = None,
    q: Annotated[Printable | None, Query(max_length=200, description="part of the job id")] = None,
    active: Annotated[bool | None, Query(description="true: not finished; false: finished")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> dict[str, Any]:
    """The jobs the caller may read, newest first, one page at a time."""
    from iris_airflow_provider.plugins.job_documents import job_row_document
    from iris_airflow_provider.services.job_views import never_fitting

    job_filter = JobFilter(
        states=_enum_list("state", state, JobState),
        directions=_enum_list("direction", direction, Direction),
        peer_id=peer,
        submitter=submitter or None,
        dag_id=dag_id or None,
        job_id_contains=q or None,
        active=active,
    )
    queries = MonitoringQueries(fed.store)
    scope = who.scope("GET", queries)
    page = queries.list_jobs(job_filter, scope, limit=limit, offset=offset)
    facets = queries.facets(scope)
    now = now_ms()
    never = never_fitting(fed, page.jobs, now)
    rows = []
    for job in page.jobs:
        row = job_row_document(job, now)
        row["can_cancel"] = not job.terminal and who.may_job("PUT", job)
        row["never_fits"] = job.job_id in never
        rows.append(row)
    return {
        "jobs": rows,
        "total": page.total,
        "limit": page.limit,
        "offset": page.offset,
        "facets": {"states": facets.states, "peers": facets.peers, "submitters": facets.submitters},
        "user": who.name,
    }


@app.get("/api/jobs/describe")
def describe(who: CallerDep, fed: FederationDep, job_id: JobId) -> dict[str, Any]:
    """One job: where it is, its history of transitions and pending reasons, its latest output."""
    from iris_airflow_provider.plugins.job_documents import job_details_document

    job = _job(fed, job_id, who, "GET")
    details = job_details_document(fed, job, now_ms())
    details["can_cancel"] = not job.terminal and who.may_job("PUT", job)
    return details


@app.get("/api/jobs/explain")
def explain(who: CallerDep, fed: FederationDep, job_id: JobId) -> dict[str, Any]:
    """Why the job waits: each peer and backend, shape match, free and reclaimable capacity, what must change."""
    from iris_airflow_provider.services.job_views import job_explanation

    return job_explanation(fed, _job(fed, job_id, who, "GET"), now_ms())


@app.post("/api/jobs/cancel")
def cancel(
    who: CallerDep,
    fed: FederationDep,
    job_id: JobId,
    csrf: Annotated[str | None, Header(alias=CSRF_HEADER)] = None,
) -> dict[str, Any]:
    """Cancel a job: before handoff it never reaches a peer; after, the peer is told until it confirms."""
    from iris_airflow_provider.plugins.job_documents import cancel_document

    if who.via_cookie and not csrf:
        raise HTTPException(403, f"{CSRF_HEADER}: this header is required when signing in with the UI's cookie")
    _job(fed, job_id, who, "PUT")
    answer = cancel_document(fed.cancels.cancel_with_answer(job_id), now_ms())
    if answer["result"] == "not_found":
        raise HTTPException(404, answer["message"])
    if answer["result"] == "already_finished":
        raise HTTPException(409, answer["message"])
    log.info("Federation page: %s cancelled job %s (%s)", who.name, job_id, answer["result"])
    return answer

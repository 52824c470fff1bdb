"""Every endpoint of the Federation page's API: what it returns, who may call it, and bad parameters."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.placement import Promotion
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.operators.runner_runs import RUNNER_DAG_ID
from iris_airflow_provider.plugins import ui_api
from iris_airflow_provider.plugins.iris_federation import IrisFederationPlugin
from tests.ui.conftest import CLEANUP, EVAL, RECEIVED, TRAIN

API = "/api"
ENDPOINTS = [
    ("GET", "/api/peers", {}),
    ("GET", "/api/jobs", {}),
    ("GET", "/api/jobs/describe", {"job_id": TRAIN}),
    ("GET", "/api/jobs/explain", {"job_id": TRAIN}),
    ("POST", "/api/jobs/cancel", {"job_id": TRAIN}),
]


# Authentication ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "params"), ENDPOINTS)
def test_every_endpoint_refuses_a_caller_without_a_token(client, method, path, params):
    response = client.request(method, path, params=params)
    assert response.status_code == 401
    assert "Not authenticated" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path", "params"), ENDPOINTS)
def test_every_endpoint_refuses_a_forged_token(client, method, path, params):
    # Airflow's own answers (its API's get_user), as for its REST API.
    response = client.request(method, path, params=params, headers={"Authorization": "Bearer not.a.jwt"})
    assert (response.status_code, response.json()["detail"]) == (403, "Invalid JWT token")


def test_an_expired_token_and_another_scheme_are_refused(client, token):
    expired = token("admin", expiration_time_in_seconds=-3600)
    response = client.get("/api/jobs", headers={"Authorization": f"Bearer {expired}"})
    assert (response.status_code, response.json()["detail"]) == (401, "Token Expired")
    response = client.get("/api/jobs", headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    assert (response.status_code, response.json()["detail"]) == (401, "Not authenticated")


def test_the_ui_session_cookie_authenticates_and_a_cookie_cancel_needs_the_csrf_header(client, token):
    client.cookies.set("_token", token("alice"))
    assert client.get("/api/jobs").json()["user"] == "alice"
    refused = client.post("/api/jobs/cancel", params={"job_id": TRAIN})
    assert refused.status_code == 403 and refused.json()["detail"].startswith("X-Iris-Federation:")
    assert client.get("/api/jobs/describe", params={"job_id": TRAIN}).json()["state"] == "pending"
    done = client.post("/api/jobs/cancel", params={"job_id": TRAIN}, headers={"X-Iris-Federation": "ui"})
    assert (done.status_code, done.json()["result"]) == (200, "cancelled")


# Peers --------------------------------------------------------------------------------------------------


def test_peers_follow_the_list_peers_shape_with_local_backends_and_the_fleet(client, as_user):
    body = client.get("/api/peers", headers=as_user("viewer")).json()
    assert body["cluster"] == "marin"
    assert [p["peer_id"] for p in body["peers"]] == ["cw-gb200", "cw-h100"]
    h100 = body["peers"][1]
    assert h100["reachable"] is True and h100["stale"] is False and h100["kind"] == "agentless"
    assert 0 <= h100["heartbeat_age_ms"] < 60_000 and isinstance(h100["last_contact_ms"], int)
    assert h100["active_federated_jobs"] == 0  # queued unpinned jobs count against no peer (as the reference)
    (backend,) = h100["backends"]
    assert backend["backend_id"] == "default" and backend["kind"] == "process"
    assert backend["advertised_attributes"]["device-variant"] == {"values": ["h100"]}
    availability = backend["availability"]
    assert availability["version"] == 2 and isinstance(availability["observation_epoch_ms"], int)
    assert (availability["amounts"], availability["total_amounts"]) == ({"h100": 8}, {"h100": 8})
    assert (backend["pending_task_count"], backend["running_task_count"]) == (0, 0)
    (cpu,) = body["local_backends"]
    assert cpu["backend_id"] == "cpu" and cpu["pending_task_count"] == 2  # the local job and the received one
    fleet = {entry["variant"]: entry for entry in body["fleet"]}
    assert (fleet["h100"]["free"], fleet["h100"]["total"]) == (8, 8)
    assert fleet["gb200"]["targets"] == [{"target": "cw-gb200/default", "free": 4, "total": 4, "reserved": 0}]


def test_capacity_handed_off_and_not_yet_running_there_is_shown_as_reserved(client, as_user, federation):
    (backend,) = next(p for p in federation.store.peers() if p.peer_id == "cw-h100").backends
    promotion = Promotion(EVAL, "cw-h100", "default", False, {"h100": 4}, backend.observation_epoch_ms)
    assert federation.store.apply_promotions([promotion], federation.clock()) == [promotion]
    body = client.get("/api/peers", headers=as_user("viewer")).json()
    h100 = next(p for p in body["peers"] if p["peer_id"] == "cw-h100")
    assert h100["backends"][0]["reserved"] == {"h100": 4} and h100["active_federated_jobs"] == 1
    assert h100["backends"][0]["reserved_jobs"] == [EVAL]
    assert (
        h100["backends"][0]["reserved_note"] == "4 h100 reserved for jobs handed off and not yet running there (1 job)"
    )
    assert h100["backends"][0]["availability"]["amounts"] == {"h100": 8}  # as advertised, unchanged
    fleet = {entry["variant"]: entry for entry in body["fleet"]}
    assert (fleet["h100"]["free"], fleet["h100"]["reserved"]) == (8, 4)
    assert next(p for p in body["peers"] if p["peer_id"] == "cw-gb200")["backends"][0]["reserved"] == {}


def test_an_unreachable_peer_is_shown_as_such_and_left_out_of_the_fleet(client, as_user, federation):
    federation.store.record_heartbeat("cw-gb200", federation.clock(), None, error="connection refused")
    body = client.get("/api/peers", headers=as_user("admin")).json()
    gb200 = body["peers"][0]
    assert (gb200["reachable"], gb200["last_error"]) == (False, "connection refused")
    assert gb200["backends"][0]["availability"]["total_amounts"] == {"gb200": 4}  # last known, still shown
    assert "gb200" not in {entry["variant"] for entry in body["fleet"]}


# Jobs ---------------------------------------------------------------------------------------------------


def test_jobs_are_listed_newest_first_with_their_pending_reasons_and_task_links(client, as_user):
    body = client.get("/api/jobs", headers=as_user("admin")).json()
    assert [job["job_id"] for job in body["jobs"]] == [RECEIVED, CLEANUP, EVAL, TRAIN]
    assert body["total"] == 4 and body["user"] == "admin"
    train = body["jobs"][3]
    assert train["pending_reason"] == reasons.QUEUED_UNPINNED
    assert (train["state"], train["handoff_state"], train["submitter"]) == ("pending", "queued", "alice")
    assert train["priority_band"] == "PRIORITY_BAND_BATCH" and train["resources"] == "16 h100"
    assert train["task_instance_path"] == "dags/dag_a/runs/manual__1/tasks/run"
    assert body["jobs"][2]["task_instance_path"] == "dags/dag_b/runs/manual__2/tasks/run/mapped/3"
    received = body["jobs"][0]
    assert received["dag_id"] == RUNNER_DAG_ID
    assert received["task_instance_path"].startswith(f"dags/{RUNNER_DAG_ID}/runs/iris__parent~received__abcdef01/")
    assert body["jobs"][1]["task_instance_path"] is None and body["jobs"][1]["dag_id"] is None
    assert all(job["can_cancel"] for job in body["jobs"])
    # Queued and no backend anywhere has 16 h100: the page marks it.
    assert [job["job_id"] for job in body["jobs"] if job["never_fits"]] == [TRAIN]
    assert body["facets"]["states"]["pending"] == 4
    assert body["facets"]["submitters"] == ["alice", "bob", "dave", "ops"]


def test_jobs_filter_and_page_on_the_server(client, as_user):
    def ids(**params):
        return [job["job_id"] for job in client.get("/api/jobs", params=params, headers=as_user("bob")).json()["jobs"]]

    assert ids(submitter="alice") == [TRAIN]
    assert ids(direction="local,received") == [RECEIVED, CLEANUP]
    assert ids(peer="parent") == [RECEIVED]
    assert ids(q="DAG_B") == [EVAL]
    assert ids(dag_id="dag_a") == [TRAIN]
    assert ids(state=["running", "succeeded"]) == []
    assert ids(limit=2, offset=1) == [CLEANUP, EVAL]
    assert client.get("/api/jobs", params={"limit": 2}, headers=as_user("bob")).json()["total"] == 4


def test_a_viewer_reads_everything_but_may_cancel_nothing(client, as_user):
    body = client.get("/api/jobs", headers=as_user("viewer")).json()
    assert body["total"] == 4 and not any(job["can_cancel"] for job in body["jobs"])
    response = client.post("/api/jobs/cancel", params={"job_id": TRAIN}, headers=as_user("viewer"))
    assert response.status_code == 403
    assert response.json()["detail"] == f"viewer may not cancel job {TRAIN}: that needs edit access to DAG dag_a"
    assert client.get("/api/jobs/describe", params={"job_id": TRAIN}, headers=as_user("viewer")).json()["state"] == (
        "pending"
    )


@pytest.mark.parametrize(
    ("path", "params", "parameter"),
    [
        ("/api/jobs", {"limit": 0}, "limit"),
        ("/api/jobs", {"limit": 501}, "limit"),
        ("/api/jobs", {"limit": "many"}, "limit"),
        ("/api/jobs", {"offset": -1}, "offset"),
        ("/api/jobs", {"state": "stuck"}, "state"),
        ("/api/jobs", {"state": "pending,sleeping"}, "state"),
        ("/api/jobs", {"direction": "sideways"}, "direction"),
        ("/api/jobs", {"active": "maybe"}, "active"),
        ("/api/jobs", {"q": "x" * 201}, "q"),
        ("/api/jobs/describe", {}, "job_id"),
        ("/api/jobs/describe", {"job_id": ""}, "job_id"),
        ("/api/jobs/explain", {"job_id": "x" * 1001}, "job_id"),
        # Issue 11: NUL and control characters in filters, and job ids the one rule refuses.
        ("/api/jobs", {"q": "train\x00"}, "q"),
        ("/api/jobs", {"submitter": "\x1b[2Jalice"}, "submitter"),
        ("/api/jobs", {"dag_id": "dag\x00"}, "dag_id"),
        ("/api/jobs", {"peer": "cw\x7f"}, "peer"),
        ("/api/jobs/describe", {"job_id": "/../.."}, "job_id"),
        ("/api/jobs/explain", {"job_id": "/alice/train\x00"}, "job_id"),
        ("/api/jobs", {"state": "pending\x00"}, "state"),
    ],
)
def test_a_bad_parameter_is_a_422_naming_it(client, as_user, path, params, parameter):
    response = client.get(path, params=params, headers=as_user("admin"))
    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{parameter}: "), response.json()


def test_a_cancel_without_a_job_id_is_a_422_naming_it(client, as_user):
    response = client.post("/api/jobs/cancel", headers=as_user("admin"))
    assert (response.status_code, response.json()["detail"].split(":")[0]) == (422, "job_id")


def test_a_cancel_of_an_invalid_job_id_is_a_422_stating_the_rule(client, as_user):
    response = client.post("/api/jobs/cancel", params={"job_id": "/a/./b"}, headers=as_user("admin"))
    assert response.status_code == 422
    assert response.json()["detail"].startswith("job_id: must look like /<user>/<name>")
    assert "'.' segment" in response.json()["detail"]


def test_a_control_character_is_named_as_such_and_a_cancel_is_refused_too(client, as_user, federation):
    response = client.get("/api/jobs", params={"peer": "cw\x00"}, headers=as_user("admin"))
    detail = response.json()["detail"]
    assert detail.startswith("peer: ") and "control" in detail
    response = client.post("/api/jobs/cancel", params={"job_id": TRAIN + "\x00"}, headers=as_user("admin"))
    assert (response.status_code, response.json()["detail"].split(":")[0]) == (422, "job_id")
    assert not federation.store.get_job(TRAIN).cancel_requested


@pytest.mark.parametrize("path", ["/api/jobs/describe", "/api/jobs/explain"])
def test_an_unknown_job_is_a_404(client, as_user, path):
    response = client.get(path, params={"job_id": "/nobody/nothing"}, headers=as_user("admin"))
    assert (response.status_code, response.json()["detail"]) == (404, "Job /nobody/nothing not found")
    response = client.post("/api/jobs/cancel", params={"job_id": "/nobody/nothing"}, headers=as_user("admin"))
    assert response.status_code == 404


# Describe, explain, cancel ------------------------------------------------------------------------------------


def test_describe_gives_the_history_and_every_pending_reason(client, as_user, federation):
    federation.store.request_cancel(EVAL, federation.clock())
    body = client.get("/api/jobs/describe", params={"job_id": EVAL}, headers=as_user("alice")).json()
    assert [event["kind"] for event in body["events"]] == ["admitted", "cancel_requested", "state"]
    assert body["events"][-1]["state"] == "killed" and body["events"][-1]["detail"] == reasons.CANCELLED_BEFORE_HANDOFF
    assert body["pending_reasons"] == [reasons.QUEUED_UNPINNED]
    assert (body["state"], body["error"], body["can_cancel"]) == ("killed", reasons.CANCELLED_BEFORE_HANDOFF, False)
    assert body["spec"]["resources"]["device"]["count"] == 4 and body["origin"]["map_index"] == 3
    assert (body["requeue_count"], body["avoided_peers"]) == (0, [])


def test_explain_shows_each_peer_and_backend_and_what_would_have_to_change(client, as_user):
    body = client.get("/api/jobs/explain", params={"job_id": TRAIN}, headers=as_user("viewer")).json()
    # It stays queued with the seed's reason, but waiting will not help: no backend is that large.
    assert (body["status"], body["pending_reason"]) == ("never_fits", reasons.QUEUED_UNPINNED)
    assert body["summary"] == (
        "No reachable backend can ever hold it: Job /alice/dag_a.run.manual__1 needs 16 h100 on one backend; "
        "the largest that can host it is cw-h100/default with 8 in total. It stays queued in case a larger "
        "backend reports; cancel it or ask for less."
    )
    detail = body["explanation"]
    assert detail["never_fits"] is True
    assert detail["gate"] == {"h100": 16} and detail["band"] == "PRIORITY_BAND_BATCH"
    assert detail["jobs_ahead"] == 1  # EVAL: a higher band goes first
    rows = {(p["peer_id"], b["backend_id"]): (p["status"], b) for p in detail["peers"] for b in p["backends"]}
    status, h100 = rows[("cw-h100", "default")]
    assert status == "ok" and h100["shape_matches"] and h100["fits"] is False
    assert (h100["free"], h100["reclaimable"]) == ({"h100": 4}, {"h100": 0})  # EVAL takes 4 first in this pass
    _, gb200 = rows[("cw-gb200", "default")]
    assert gb200["shape_matches"] is False and gb200["unmet"] == ["device-variant EQ h100"]
    placeable = client.get("/api/jobs/explain", params={"job_id": EVAL}, headers=as_user("viewer")).json()
    assert placeable["status"] == "placeable"
    assert placeable["summary"] == "It fits now on cw-h100/default: the next placement tick promotes it."
    local = client.get("/api/jobs/explain", params={"job_id": CLEANUP}, headers=as_user("viewer")).json()
    assert local["status"] == "local" and "local backend cpu" in local["summary"]


def test_cancel_ends_a_queued_job_before_handoff_and_a_second_cancel_is_a_conflict(client, as_user, federation):
    response = client.post("/api/jobs/cancel", params={"job_id": TRAIN}, headers=as_user("bob"))
    assert response.status_code == 200
    body = response.json()
    assert (body["result"], body["message"]) == ("cancelled", reasons.CANCELLED_BEFORE_HANDOFF)
    assert body["job"]["state"] == "killed"
    job = federation.store.get_job(TRAIN)
    assert job.state is JobState.KILLED and job.cancel_requested
    again = client.post("/api/jobs/cancel", params={"job_id": TRAIN}, headers=as_user("bob"))
    assert again.status_code == 409 and "already finished (killed)" in again.json()["detail"]


def test_cancel_of_a_local_job_is_routed_to_its_backend(client, as_user, federation):
    body = client.post("/api/jobs/cancel", params={"job_id": CLEANUP}, headers=as_user("admin")).json()
    # The job never reached the process backend (it was only admitted), so the backend reports it gone.
    assert body["result"] == "cancel_requested"
    assert federation.store.get_job(CLEANUP).state is JobState.KILLED


# Per-DAG authorization with an auth manager that scopes users to DAGs -------------------------------------------


class DagScopedAuthManager:
    """Airflow's SimpleAuthManager, except that carol may only touch task instances of dag_a.

    Asked about no DAG in particular, it answers as FAB's auth manager does: whether carol may act
    on some DAG (she may), not on every DAG (tests/e2e/test_security.py runs the real FAB).
    """

    @staticmethod
    def build() -> type:
        from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

        class Scoped(SimpleAuthManager):  # type: ignore[misc]
            def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
                if user.get_name() == "carol":
                    return details is None or not details.id or details.id == "dag_a"
                return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

        return Scoped


@pytest.fixture
def dag_scoped(auth_manager):
    from airflow.api_fastapi import app as airflow_app
    from airflow.configuration import conf

    import tests.ui.test_ui_api as module

    module.ScopedAuthManager = DagScopedAuthManager.build()
    previous = conf.get("core", "auth_manager")
    conf.set("core", "auth_manager", "tests.ui.test_ui_api.ScopedAuthManager")
    airflow_app.init_auth_manager()
    yield
    conf.set("core", "auth_manager", previous)
    airflow_app.init_auth_manager()


def test_a_user_scoped_to_one_dag_sees_and_cancels_only_its_jobs(client, as_user, dag_scoped):
    carol = as_user("carol")
    body = client.get("/api/jobs", headers=carol).json()
    assert [job["job_id"] for job in body["jobs"]] == [TRAIN] and body["total"] == 1
    assert body["facets"]["submitters"] == ["alice"]
    # A job she may not read is answered as one that does not exist: nothing says it is there.
    denied = client.get("/api/jobs/describe", params={"job_id": EVAL}, headers=carol)
    assert (denied.status_code, denied.json()["detail"]) == (404, f"Job {EVAL} not found")
    assert client.get("/api/jobs/explain", params={"job_id": CLEANUP}, headers=carol).status_code == 404
    assert client.post("/api/jobs/cancel", params={"job_id": RECEIVED}, headers=carol).status_code == 404
    assert client.post("/api/jobs/cancel", params={"job_id": TRAIN}, headers=carol).json()["result"] == "cancelled"
    assert client.get("/api/jobs", headers=as_user("bob")).json()["total"] == 4  # others are unaffected


# The page itself --------------------------------------------------------------------------------------------


def test_the_plugin_registers_the_page_in_the_navigation_and_serves_its_bundle(client):
    (page,) = IrisFederationPlugin.react_apps
    assert (page["url_route"], page["destination"], page["nav_top_level"]) == ("iris-federation", "nav", True)
    assert page["bundle_url"].startswith("iris/federation/ui/static/federation-page.js?v=")
    apps = {app["url_prefix"]: app["app"] for app in IrisFederationPlugin.fastapi_apps}
    assert apps["/iris/federation/ui"] is ui_api.app
    bundle = client.get("/static/federation-page.js")
    assert bundle.status_code == 200 and "javascript" in bundle.headers["content-type"]
    assert "globalThis.AirflowPlugin = FederationPage" in bundle.text
    for icon in ("icon", "icon_dark_mode"):
        assert client.get("/static/" + page[icon].rsplit("/", 1)[1]).headers["content-type"] == "image/svg+xml"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_bundle_is_valid_javascript():
    check = subprocess.run(["node", "--check", str(ui_api.STATIC_DIR / ui_api.BUNDLE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


# What arrives unauthenticated ---------------------------------------------------------------------------


class LazyBody:
    """A 300 MiB request body produced on demand, counting what the server pulled."""

    def __init__(self, size: int = 300 * 2**20) -> None:
        self.size = size
        self.pulled = 0

    async def __aiter__(self):
        while self.pulled < self.size:
            self.pulled += 2**20
            yield b"x" * 2**20


@pytest.mark.parametrize("authenticated", [False, True])
async def test_a_300_mib_body_sent_to_cancel_is_never_read(client, as_user, authenticated):
    """Cancel takes its job id as a query parameter: no route of this API reads a body."""
    import httpx

    body = LazyBody()
    headers = {"Content-Length": str(body.size), **(as_user("admin") if authenticated else {})}
    transport = httpx.ASGITransport(app=ui_api.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://airflow") as http:
        response = await http.post("/api/jobs/cancel", params={"job_id": TRAIN}, content=body, headers=headers)
    assert response.status_code == (200 if authenticated else 401), response.text
    assert body.pulled == 0


@pytest.mark.parametrize("path", ["/openapi.json", "/docs"])
def test_the_api_description_is_for_signed_in_users_only(client, as_user, token, path):
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer not.a.jwt"}).status_code == 403
    signed_in = client.get(path, headers=as_user("viewer"))
    assert signed_in.status_code == 200
    if path == "/openapi.json":
        assert "/api/jobs/cancel" in signed_in.json()["paths"]
    else:  # the Swagger page, which fetches the document with the same (cookie) sign-in
        assert "/openapi.json" in signed_in.text
        client.cookies.set(ui_api.COOKIE, token("viewer"))
        assert client.get(path).status_code == 200
    assert client.get("/redoc", headers=as_user("viewer")).status_code == 404

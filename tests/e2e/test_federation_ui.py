"""The Federation page and its API in a running Airflow: real api-server, real tokens, real Chromium.

The scenario: ``cw-gb200`` (4 gb200) is full with a production-band job, so a job pinned to it waits
in the queue. Users are the deployment's: admin, alice and bob (role user), viewer (role viewer).
The browser test signs in as alice through Airflow's login form, sees the peer's meters and the
queued job's pending reason, opens the job, cancels it, and saves screenshots in ``.artifacts/ui/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import expect

from devtools.airflow_deployment import AirflowDeployment
from devtools.browser import page_url, sign_in
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.states import HandoffState, JobState
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import ARTIFACTS
from tests.e2e.jobs import admitted_job_of
from tests.waiting import wait_for

expect.set_options(timeout=30_000)  # as patient as the pages' own default timeout (a busy CI machine)

# Real services take seconds per step: wait longer, and poll less often, than unit tests do.
_wait = partial(wait_for, timeout=90, interval=0.5)

pytestmark = pytest.mark.e2e

API = "/iris/federation/ui/api"
PINNED_REASON = "Queued for peer cw-gb200 to report free capacity"


@pytest.fixture(scope="module")
def scenario(deployment: AirflowDeployment, store: FederationStore) -> Iterator[dict[str, str]]:
    gb200 = {"type": "gpu", "variant": "gb200", "count": 4}
    blocker_run = deployment.trigger(
        "e2e_job",
        {"job": {"command": "sleep 600", "resources": {"device": gb200}, "priority_band": "production"}},
        user="alice",
    )
    blocker = admitted_job_of(deployment, blocker_run)
    _wait(lambda: store.get_job(blocker).state is JobState.RUNNING, "the blocker to run on cw-gb200")
    pinned_run = deployment.trigger(
        "e2e_job",
        {"job": {"command": "echo never", "resources": {"device": gb200}, "target_cluster": "cw-gb200"}},
        user="bob",
    )
    pinned = admitted_job_of(deployment, pinned_run)
    time.sleep(5)  # several ticks (sync every 2 s): it must still be waiting for the full peer
    job = store.get_job(pinned)
    assert job.handoff_state is HandoffState.QUEUED and job.pending_reason == PINNED_REASON
    yield {"blocker": blocker, "blocker_run": blocker_run, "pinned": pinned, "pinned_run": pinned_run}
    # Nothing may outlive the deployment: the blocker's process runs detached on the peer's backend.
    response = deployment.api("POST", f"{API}/jobs/cancel", params={"job_id": blocker})
    assert response.status_code == 200, response.text
    _wait(lambda: store.get_job(blocker).state is JobState.KILLED, "the blocker to be cancelled on its peer")


def api(deployment: AirflowDeployment, method: str, path: str, user: str | None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {deployment.token(user)}"} if user else {}
    return httpx.request(method, f"{deployment.base_url}{API}{path}", headers=headers, timeout=60, **kwargs)


# The API through the real api-server ---------------------------------------------------------------------------


def test_the_page_is_registered_in_the_navigation_and_the_task_links_to_it(deployment, scenario):
    plugins = deployment.api("GET", "/api/v2/plugins").json()["plugins"]
    (page,) = [app for plugin in plugins for app in plugin["react_apps"] if app["url_route"] == "iris-federation"]
    assert (page["name"], page["destination"], page["nav_top_level"]) == ("Federation", "nav", True)
    bundle = httpx.get(f"{deployment.base_url}/{page['bundle_url']}", timeout=30)
    assert bundle.status_code == 200 and "globalThis.AirflowPlugin" in bundle.text
    links = deployment.api(
        "GET", f"/api/v2/dags/e2e_job/dagRuns/{quote(scenario['pinned_run'], safe='')}/taskInstances/run/links"
    ).json()
    assert links["extra_links"]["Federation"] == page_url(deployment.base_url, scenario["pinned"])


def test_the_api_requires_a_valid_airflow_token(deployment, scenario):
    for method, path in [("GET", "/peers"), ("GET", "/jobs"), ("POST", "/jobs/cancel")]:
        response = api(deployment, method, path, None, params={"job_id": scenario["pinned"]})
        assert response.status_code == 401, (path, response.text)
    forged = httpx.get(
        f"{deployment.base_url}{API}/jobs", headers={"Authorization": "Bearer x.y.z"}, timeout=30
    )  # not signed by this deployment
    assert (forged.status_code, forged.json()["detail"]) == (
        403,
        "Invalid JWT token",
    )  # Airflow's own answer (its get_user)


def test_a_viewer_sees_the_full_peer_and_the_queued_job_but_may_not_cancel_it(deployment, scenario):
    peers = api(deployment, "GET", "/peers", "viewer").json()
    gb200 = next(peer for peer in peers["peers"] if peer["peer_id"] == "cw-gb200")
    assert gb200["reachable"] and gb200["active_federated_jobs"] == 2  # the running blocker and the pinned job
    availability = gb200["backends"][0]["availability"]
    assert (availability["amounts"], availability["total_amounts"]) == ({"gb200": 0}, {"gb200": 4})
    assert availability["held_by_band"] == [{"band": "PRIORITY_BAND_PRODUCTION", "amounts": {"gb200": 4}}]
    jobs = api(deployment, "GET", "/jobs", "viewer", params={"state": "pending", "peer": "cw-gb200"}).json()
    (pinned,) = jobs["jobs"]
    assert (pinned["job_id"], pinned["pending_reason"], pinned["can_cancel"]) == (
        scenario["pinned"],
        PINNED_REASON,
        False,
    )
    assert pinned["task_instance_path"] == f"dags/e2e_job/runs/{quote(scenario['pinned_run'], safe='')}/tasks/run"
    refused = api(deployment, "POST", "/jobs/cancel", "viewer", params={"job_id": scenario["pinned"]})
    assert refused.status_code == 403 and "needs edit access to DAG e2e_job" in refused.json()["detail"]


def test_a_user_gets_the_explanation_and_bad_parameters_are_named(deployment, scenario):
    explained = api(deployment, "GET", "/jobs/explain", "alice", params={"job_id": scenario["pinned"]}).json()
    assert explained["status"] == "waiting" and explained["pending_reason"] == PINNED_REASON
    assert explained["summary"].startswith("Needs 4 gb200 on one backend; the most any matching backend offers is 0")
    assert [peer["peer_id"] for peer in explained["explanation"]["peers"]] == ["cw-gb200"]  # its pin only
    described = api(deployment, "GET", "/jobs/describe", "bob", params={"job_id": scenario["pinned"]}).json()
    assert described["events"][0]["kind"] == "admitted" and described["pending_reasons"] == [PINNED_REASON]
    bad = api(deployment, "GET", "/jobs", "alice", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("limit: ")
    missing = api(deployment, "GET", "/jobs/describe", "alice", params={"job_id": "/nobody/nothing"})
    assert missing.status_code == 404


# The page in Chromium ------------------------------------------------------------------------------------------


def _open_page(browser: Any, deployment: AirflowDeployment, user: str, scheme: str, errors: list[str]) -> Any:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme=scheme)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, deployment.base_url, user, deployment.password(user))
    page.goto(page_url(deployment.base_url))
    return page


def test_in_chromium_a_user_sees_meters_and_the_pending_reason_opens_the_job_and_cancels_it(
    deployment, store, scenario, browser
):
    errors: list[str] = []
    page = _open_page(browser, deployment, "alice", "light", errors)

    # The page loads its data after it renders: every check retries until it holds (or 30 s pass).
    meter = page.get_by_test_id("peer-cw-gb200").get_by_role("meter", name="gb200 on cw-gb200/default")
    expect(meter).to_have_attribute("aria-valuetext", "0 of 4 gb200 free")
    expect(page.get_by_test_id("peer-cw-gb200")).to_contain_text("held: production 4")
    expect(page.get_by_test_id("peer-cw-h100").get_by_role("meter")).to_have_attribute("aria-valuenow", "8")
    row = page.locator(f'tr[data-job-id="{scenario["pinned"]}"]')
    expect(row.get_by_test_id("pending-reason")).to_have_text(PINNED_REASON)
    page.screenshot(path=str(ARTIFACTS / "federation-page.png"), full_page=True)

    # The filters page on the server: pending jobs of bob leave the pinned job alone.
    page.get_by_label("State").select_option("pending")
    page.get_by_label("Submitter").select_option("bob")
    page.get_by_test_id("jobs-count").get_by_text("1\u20131 of 1").wait_for()
    expect(page.locator("tr[data-job-id]")).to_have_count(1)
    assert "state=pending" in page.url

    row.get_by_role("link", name=scenario["pinned"]).click()
    detail = page.get_by_test_id("job-detail")
    expect(detail.get_by_test_id("detail-pending-reason")).to_have_text(PINNED_REASON)
    explanation = detail.get_by_test_id("explanation")
    explanation.get_by_text("Needs 4 gb200 on one backend", exact=False).first.wait_for()
    expect(explanation).to_contain_text("cw-gb200")
    expect(explanation).to_contain_text("matches")
    expect(detail.get_by_test_id("history")).to_contain_text("admitted")
    assert "job=" in page.url  # the detail is a link: /plugin/iris-federation?job=<job id>
    page.wait_for_timeout(400)  # the drawer's opening animation
    page.screenshot(path=str(ARTIFACTS / "job-detail.png"))

    detail.get_by_role("button", name="Cancel job").click()
    detail.get_by_role("button", name="Yes, cancel it").click()
    expect(detail.get_by_test_id("cancel-result")).to_have_text(reasons.CANCELLED_BEFORE_HANDOFF)
    detail.locator('[data-state="killed"]').wait_for()
    page.screenshot(path=str(ARTIFACTS / "job-cancelled.png"))
    detail.get_by_role("button", name="Close").click()
    detail.wait_for(state="detached")
    assert "job=" not in page.url and "state=pending" in page.url
    job = store.get_job(scenario["pinned"])
    assert (job.state, job.error) == (JobState.KILLED, reasons.CANCELLED_BEFORE_HANDOFF)
    assert deployment.wait_for_run("e2e_job", scenario["pinned_run"], timeout=60) == "failed"
    assert errors == []


def test_in_chromium_the_dark_theme_renders_and_a_viewer_gets_no_cancel_button(deployment, scenario, browser):
    errors: list[str] = []
    page = _open_page(browser, deployment, "viewer", "dark", errors)
    page.get_by_test_id("peer-cw-gb200").get_by_role("meter").wait_for()
    assert "dark" in (page.locator("html").get_attribute("class") or "")
    page.screenshot(path=str(ARTIFACTS / "federation-page-dark.png"), full_page=True)
    page.goto(page_url(deployment.base_url, scenario["blocker"]))
    detail = page.get_by_test_id("job-detail")
    detail.get_by_test_id("history").wait_for()
    assert detail.get_by_role("button", name="Cancel job").count() == 0
    assert errors == []


def test_in_chromium_a_queued_job_no_backend_could_ever_hold_is_marked(deployment, store, browser):
    """Queued when a larger backend was there (written straight into the store: submit would now
    reject it), a 16-h100 job against peers of 8 at most stays queued, marked, and says why."""
    from iris_airflow_provider.core.model import parse_job
    from iris_airflow_provider.core.states import Direction
    from iris_airflow_provider.store.records import NewIncarnation

    job_id = "/alice/too-big"
    spec = parse_job({"job_id": job_id, "resources": {"device": {"type": "gpu", "variant": "h100", "count": 16}}})
    store.admit(NewIncarnation(spec, direction=Direction.SENT, submitting_user="alice"), now_ms=int(time.time() * 1000))
    errors: list[str] = []
    try:
        page = _open_page(browser, deployment, "alice", "light", errors)
        row = page.locator(f'tr[data-job-id="{job_id}"]')
        row.get_by_test_id("never-fits").wait_for()
        assert row.get_by_test_id("never-fits").inner_text() == "can never fit"
        row.get_by_role("link", name=job_id).click()
        explanation = page.get_by_test_id("job-detail").get_by_test_id("explanation")
        explanation.get_by_text("No reachable backend can ever hold it", exact=False).first.wait_for()
        assert "the largest that can host it is cw-h100/default with 8 in total" in explanation.inner_text()
        page.screenshot(path=str(ARTIFACTS / "job-never-fits.png"))
        assert errors == []
    finally:
        response = deployment.api("POST", f"{API}/jobs/cancel", params={"job_id": job_id})
        assert response.status_code == 200, response.text

"""The provider as a real api-server serves it: the store's connection form and Test button, the
plugin registered once whether providers are discovered lazily or eagerly, the integration's logo.

Two api-servers (no scheduler, triggerer or dag-processor: nothing here runs a DAG) on PostgreSQL:
one with Airflow's defaults plus ``[core] test_connection = Enabled`` (what the Test button needs),
one with ``[core] lazy_discover_providers = False``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.airflow_deployment import AirflowDeployment
from devtools.browser import sign_in
from iris_airflow_provider.store.migrate import head_revision
from iris_airflow_provider.store.store import FederationStore
from tests.e2e.conftest import ARTIFACTS, free_port, save_logs
from tests.postgres import scratch_database

pytestmark = pytest.mark.e2e

UNREACHABLE = "postgresql://iris@127.0.0.1:1/iris_federation"
# Airflow 3.3.2's Test button sends port 0 for a connection without a port, which its API compares
# with the stored NULL and refuses (apache/airflow#73298, fixed upstream after 3.3.2).
PORTLESS_TEST_BUG = "The host or port to test differs from the stored connection"


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    with scratch_database("iris_conn_store") as url:
        store = FederationStore.from_url(url)
        store.migrate()
        store.dispose()
        yield url


def _api_server(root: Path, name: str, store_url: str, env: dict[str, str]) -> Iterator[AirflowDeployment]:
    with scratch_database(f"iris_conn_{name}_meta") as metadata_url:
        deployment = AirflowDeployment(
            home=root / name,
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            components=("api-server",),
            extra_env=env,
        )
        try:
            deployment.start()
            yield deployment
        finally:
            deployment.stop()
            save_logs(deployment, f"connection-form-{name}")


@pytest.fixture(scope="module")
def lazy(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[AirflowDeployment]:
    """Airflow's defaults (providers discovered lazily), with the Test button enabled."""
    env = {"AIRFLOW__CORE__TEST_CONNECTION": "Enabled"}
    yield from _api_server(tmp_path_factory.mktemp("conn-form"), "lazy", store_url, env)


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[AirflowDeployment]:
    env = {"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
    yield from _api_server(tmp_path_factory.mktemp("conn-form"), "eager", store_url, env)


def _store_form(deployment: AirflowDeployment) -> dict[str, Any]:
    meta = deployment.api("GET", "/ui/connections/hook_meta").json()
    (form,) = [entry for entry in meta if entry["connection_type"] == "irisfederation"]
    return dict(form)


@pytest.mark.parametrize("discovery", ["lazy", "eager"])
def test_the_api_server_serves_the_relabelled_store_form(request, discovery):
    form = _store_form(request.getfixturevalue(discovery))
    assert form["hook_name"] == "Iris Federation Store"
    fields = form["standard_fields"]
    assert fields["host"] == {
        "hidden": False,
        "title": "SQLAlchemy URL",
        "placeholder": "postgresql://iris@db.example.com:5432/iris_federation",
    }
    assert fields["password"]["hidden"] is False and fields["password"]["title"] == "Password (if not in the URL)"
    assert [name for name in ("url_schema", "login", "port") if fields[name]["hidden"]] == [
        "url_schema",
        "login",
        "port",
    ]


def test_the_api_server_serves_the_peer_form_and_its_test_reaches_the_hook(lazy):
    meta = lazy.api("GET", "/ui/connections/hook_meta").json()
    (form,) = [entry for entry in meta if entry["connection_type"] == "irisfederationpeer"]
    fields = form["standard_fields"]
    assert form["hook_name"] == "Iris Federation Peer"
    assert (fields["host"]["title"], fields["host"]["placeholder"]) == (
        "Peer URL",
        "https://airflow.cw-east.example.com",
    )
    assert fields["password"]["title"] == "This cluster's private key (Ed25519 PEM)"
    assert all(fields[name]["hidden"] for name in ("url_schema", "login", "port"))
    # The Test button's request runs the peer hook in the api-server: this deployment names no peer.
    body = {"connection_id": "cw_east", "conn_type": "irisfederationpeer", "host": "https://cw-east.example.com"}
    response = lazy.api("POST", "/api/v2/connections/test", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["status"] is False
    message = response.json()["message"]
    assert message.startswith("no Airflow peer of cluster local uses connection ") and "https://cw-east" in message


@pytest.mark.parametrize("discovery", ["lazy", "eager"])
def test_the_plugin_is_registered_once_without_import_errors(request, discovery):
    deployment = request.getfixturevalue(discovery)
    plugins = deployment.api("GET", "/api/v2/plugins").json()["plugins"]
    assert [plugin["name"] for plugin in plugins] == ["iris_federation"]
    assert deployment.api("GET", "/api/v2/plugins/importErrors").json() == {"import_errors": [], "total_entries": 0}
    page = httpx.get(f"{deployment.base_url}/iris/federation/ui/api/peers", timeout=30)
    assert page.status_code == 401  # the plugin's API is mounted (an unknown path would be the UI's index, 200)


def test_the_integrations_logo_is_served_by_the_plugin(lazy):
    from iris_airflow_provider.get_provider_info import get_provider_info

    (integration,) = get_provider_info()["integrations"]
    logo = httpx.get(f"{lazy.base_url}{integration['logo']}", timeout=30)
    assert logo.status_code == 200 and logo.headers["content-type"].startswith("image/svg+xml")


def _rest_test(deployment: AirflowDeployment, host: str, connection_id: str = "iris_store_draft") -> dict[str, Any]:
    """What the Test button posts, for a connection not saved yet."""
    body = {"connection_id": connection_id, "conn_type": "irisfederation", "host": host}
    response = deployment.api("POST", "/api/v2/connections/test", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_rest_connection_test_opens_the_store_and_checks_its_schema(lazy, store_url):
    assert _rest_test(lazy, store_url) == {
        "status": True,
        "message": f"Federation store at {store_url}: reachable, schema at the current migration ({head_revision()}).",
    }
    unreachable = _rest_test(lazy, UNREACHABLE)
    assert unreachable["status"] is False
    assert unreachable["message"].startswith(f"Cannot open the federation store at {UNREACHABLE}: ")
    assert "Connection refused" in unreachable["message"]


def test_the_rest_connection_test_is_disabled_by_airflows_default(eager, store_url):
    response = eager.api(
        "POST",
        "/api/v2/connections/test",
        json={"connection_id": "x", "conn_type": "irisfederation", "host": store_url},
    )
    assert response.status_code == 403 and "Testing connections is disabled" in response.text


# In a real browser ---------------------------------------------------------------------------------------------------


def _signed_in_page(browser: Any, deployment: AirflowDeployment) -> Any:
    page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    sign_in(page, deployment.base_url, "admin", deployment.password("admin"))
    return page


def test_the_add_connection_form_shows_the_store_fields_relabelled_and_the_rest_hidden(browser, lazy, store_url):
    page = _signed_in_page(browser, lazy)
    page.goto(f"{lazy.base_url}/connections")
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[name=connection_id]").fill("iris_store_from_form")
    dialog.get_by_role("combobox").fill("Iris Federation")
    page.get_by_role("option", name="Iris Federation Store").click()
    host = dialog.locator("input[name=host]")
    host.wait_for()
    labels = [text.strip().rstrip("*").strip() for text in dialog.locator("label").all_inner_texts()]
    assert {"SQLAlchemy URL", "Password (if not in the URL)"} <= set(labels)
    assert not {"Host", "Login", "Port", "Schema"} & set(labels)
    assert host.get_attribute("placeholder") == "postgresql://iris@db.example.com:5432/iris_federation"
    for hidden in ("login", "port", "schema"):
        assert dialog.locator(f"input[name={hidden}]").count() == 0, hidden
    host.fill(store_url)
    page.screenshot(path=str(ARTIFACTS / "store-connection-form.png"))
    dialog.get_by_role("button", name="Save").click()
    page.get_by_role("row").filter(has_text="iris_store_from_form").wait_for(timeout=30_000)
    saved = lazy.api("GET", "/api/v2/connections/iris_store_from_form").json()
    assert (saved["conn_type"], saved["host"], saved["port"]) == ("irisfederation", store_url, None)


def _press_test(page: Any, deployment: AirflowDeployment, connection_id: str) -> tuple[int, dict[str, Any]]:
    page.goto(f"{deployment.base_url}/connections")
    row = page.get_by_role("row").filter(has_text=connection_id)
    with page.expect_response(lambda response: response.url.endswith("/api/v2/connections/test")) as answer:
        row.get_by_role("button", name="Test Connection").click()
    return answer.value.status, answer.value.json()


def test_the_test_button_of_a_connection_saved_from_the_form(browser, lazy, store_url):
    """A connection saved from the form has no port: Airflow 3.3.2's UI then sends port 0, which its
    API refuses before our hook runs. Strict xfail: it passes, and fails as XPASS, once Airflow is fixed."""
    lazy.api(
        "POST",
        "/api/v2/connections",
        json={"connection_id": "iris_portless", "conn_type": "irisfederation", "host": store_url},
    ).raise_for_status()
    page = _signed_in_page(browser, lazy)
    status, answer = _press_test(page, lazy, "iris_portless")
    if status == 400 and PORTLESS_TEST_BUG in answer.get("detail", ""):
        pytest.xfail("Airflow 3.3.2 refuses the Test button for connections without a port (apache/airflow#73298)")
    assert (status, answer["status"]) == (200, True), answer


@pytest.mark.parametrize(
    ("connection_id", "host", "ok"), [("iris_store_good", None, True), ("iris_store_bad", UNREACHABLE, False)]
)
def test_the_test_button_shows_the_hooks_verdict(browser, lazy, store_url, connection_id, host, ok):
    """Connections saved with a port (which the store ignores: the URL has its own), so that Airflow
    3.3.2's Test button reaches the hook (see above): the user sees the store's verdict in the UI."""
    body = {"connection_id": connection_id, "conn_type": "irisfederation", "host": host or store_url, "port": 5432}
    lazy.api("POST", "/api/v2/connections", json=body).raise_for_status()
    page = _signed_in_page(browser, lazy)
    status, answer = _press_test(page, lazy, connection_id)
    assert (status, answer["status"]) == (200, ok), answer
    expected = (
        f"reachable, schema at the current migration ({head_revision()})."
        if ok
        else f"Cannot open the federation store at {UNREACHABLE}: "
    )
    assert expected in answer["message"]
    page.get_by_text(expected, exact=False).first.wait_for(timeout=15_000)  # shown to the user
    page.screenshot(path=str(ARTIFACTS / f"store-connection-test-{'ok' if ok else 'failed'}.png"))

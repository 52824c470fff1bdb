"""The Airflow plugin of the provider (registered through the ``airflow.plugins`` entry point)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from iris_airflow_provider.links.job_page import PAGE_ROUTE
from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.job_api import JOB_API_PREFIX
from iris_airflow_provider.plugins.job_api import app as job_api
from iris_airflow_provider.plugins.peer_api import app as peer_api
from iris_airflow_provider.plugins.serving_proxy import PROXY_PREFIX
from iris_airflow_provider.plugins.serving_proxy import app as serving_proxy
from iris_airflow_provider.plugins.ui_api import UI_PREFIX, bundle_url
from iris_airflow_provider.plugins.ui_api import app as ui_api

_STATIC = f"{UI_PREFIX.lstrip('/')}/static"


class IrisFederationPlugin(AirflowPlugin):
    name = "iris_federation"
    fastapi_apps = [  # noqa: RUF012  (Airflow reads these class attributes)
        {"app": peer_api, "url_prefix": API_PREFIX, "name": "Iris federation peer API"},
        {"app": ui_api, "url_prefix": UI_PREFIX, "name": "Iris federation UI API"},
        {"app": serving_proxy, "url_prefix": PROXY_PREFIX, "name": "Iris serving proxy"},
        {"app": job_api, "url_prefix": JOB_API_PREFIX, "name": "Iris federation job API"},
    ]
    # The Federation page: a top-level entry of the main navigation, at /plugin/iris-federation
    # (the task's "Federation" extra link opens it with ?job=<job id>).
    react_apps = [  # noqa: RUF012
        {
            "name": "Federation",
            "bundle_url": bundle_url(),
            "destination": "nav",
            "url_route": PAGE_ROUTE,
            "nav_top_level": True,
            "icon": f"{_STATIC}/federation.svg",
            "icon_dark_mode": f"{_STATIC}/federation-dark.svg",
        }
    ]

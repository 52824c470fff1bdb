"""The Airflow plugin of the provider (registered through the ``airflow.plugins`` entry point)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from iris_airflow_provider.peers.wire import API_PREFIX
from iris_airflow_provider.plugins.peer_api import app as peer_api


class IrisFederationPlugin(AirflowPlugin):
    name = "iris_federation"
    fastapi_apps = [  # noqa: RUF012  (Airflow reads this class attribute)
        {"app": peer_api, "url_prefix": API_PREFIX, "name": "Iris federation peer API"},
    ]

"""Provider metadata read by Airflow's providers manager (``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from iris_airflow_provider import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "iris-airflow-provider",
        "name": "Iris Federation",
        "description": "Federates whole compute jobs across GPU and TPU clusters, "
        "following the Iris scheduler's federation semantics.",
        "versions": [__version__],
        "hooks": [
            {
                "integration-name": "Iris Federation",
                "python-modules": ["iris_airflow_provider.hooks.federation_store"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "iris_airflow_provider.hooks.federation_store.FederationStoreHook",
                "connection-type": "irisfederation",
            }
        ],
    }

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
        "operators": [
            {"integration-name": "Iris Federation", "python-modules": ["iris_airflow_provider.operators.federated"]}
        ],
        "sensors": [
            {"integration-name": "Iris Federation", "python-modules": ["iris_airflow_provider.sensors.federated"]}
        ],
        "triggers": [
            {
                "integration-name": "Iris Federation",
                "python-modules": ["iris_airflow_provider.triggers.federation", "iris_airflow_provider.triggers.wake"],
            }
        ],
        "cli": ["iris_airflow_provider.cli.definition.get_iris_federation_cli_commands"],
        "extra-links": ["iris_airflow_provider.links.job_page.FederationJobLink"],
        "plugins": [
            {
                "name": "iris_federation",
                "plugin-class": "iris_airflow_provider.plugins.iris_federation.IrisFederationPlugin",
            }
        ],
        "config": {
            "iris_federation": {
                "description": "Iris federation provider.",
                "options": {
                    "cluster_config": {
                        "description": "Path of the cluster configuration file (YAML or JSON): this cluster's "
                        "name, local backends and peers. Empty: one local CPU process backend, no peers.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/etc/airflow/iris-cluster.yaml",
                        "default": "",
                    },
                    "conn_id": {
                        "description": "Connection of the federation store (its host is a SQLAlchemy URL).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": None,
                        "default": "iris_federation_default",
                    },
                    "default_deferrable": {
                        "description": "Whether operators and sensors wait in the triggerer by default.",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": None,
                        "default": "True",
                    },
                },
            }
        },
        "connection-types": [
            {
                "hook-class-name": "iris_airflow_provider.hooks.federation_store.FederationStoreHook",
                "connection-type": "irisfederation",
            }
        ],
    }

"""Provider metadata read by Airflow's providers manager (``apache_airflow_provider`` entry point).

Kept valid against Airflow's ``provider_info.schema.json`` by a test. The plugin is not listed here:
it is registered once, by the ``airflow.plugins`` entry point (see pyproject.toml), which loads it
whether providers are discovered lazily (Airflow's default, which ignores providers' ``plugins``)
or eagerly (where listing it here too would register it twice).
"""

from __future__ import annotations

from typing import Any

from iris_airflow_provider import __version__

INTEGRATION = "Iris Federation"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "iris-airflow-provider",
        "name": "Iris Federation",
        "description": "Federates whole compute jobs across GPU and TPU clusters, "
        "following the Iris scheduler's federation semantics.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                # The external system this provider integrates: the Iris scheduler's federation.
                "external-doc-url": "https://github.com/marin-community/marin",
                # Served by the provider's plugin in the api-server (the Federation page's icon).
                "logo": "/iris/federation/ui/static/federation.svg",
                "how-to-guide": [
                    "/README.md#submitting-jobs-from-a-dag",
                    "/README.md#the-federation-store",
                    "/README.md#federating-two-airflow-deployments",
                ],
                "tags": ["service"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "iris_airflow_provider.hooks.federation_store",
                    "iris_airflow_provider.hooks.federation_peer",
                ],
            }
        ],
        "operators": [
            {"integration-name": INTEGRATION, "python-modules": ["iris_airflow_provider.operators.federated"]}
        ],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["iris_airflow_provider.sensors.federated"]}],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["iris_airflow_provider.triggers.federation", "iris_airflow_provider.triggers.wake"],
            }
        ],
        "cli": ["iris_airflow_provider.cli.definition.get_iris_federation_cli_commands"],
        "extra-links": ["iris_airflow_provider.links.job_page.FederationJobLink"],
        # The placement DAG's wake-up asset (iris-federation://wake): a registered scheme, so Airflow
        # normalizes its URI (no handler needed: the URI is fixed).
        "asset-uris": [{"schemes": ["iris-federation"], "handler": None}],
        "config": {
            "iris_federation": {
                "description": "Iris federation provider.",
                "options": {
                    "cluster_config": {
                        "description": "Path of the cluster configuration file (YAML or JSON): this cluster's "
                        "name, local backends and peers. Empty (and no cluster_config_json or "
                        "cluster_config_variable): one local CPU process backend, no peers.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/etc/airflow/iris-cluster.yaml",
                        "default": "",
                    },
                    "cluster_config_json": {
                        "description": "The cluster configuration itself, as JSON (or YAML), instead of a file: "
                        "for managed Airflow (Composer, MWAA, Astro), where shipping a file to every component is "
                        "awkward. Set at most one of cluster_config, cluster_config_json, cluster_config_variable.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": '{"name": "marin", "peers": []}',
                        "default": "",
                    },
                    "cluster_config_variable": {
                        "description": "The name of an Airflow Variable holding the cluster configuration (JSON "
                        "or YAML): it then comes from the metadata database or a secrets backend. Read once per "
                        "process; restart the components after changing it.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "iris_cluster",
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
                        "description": "Whether the operator and the sensor wait in the triggerer by default. "
                        "Unset (the default): Airflow's [operators] default_deferrable.",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": None,
                    },
                },
            }
        },
        # The connection form, declared here because Airflow 3.3 builds it from metadata without
        # importing the hook (a hook's get_ui_field_behaviour needs wtforms, absent by default).
        "connection-types": [
            _host_and_secret_form(
                "iris_airflow_provider.hooks.federation_store.FederationStoreHook",
                "Iris Federation Store",
                "irisfederation",
                host=("SQLAlchemy URL", "postgresql://iris@db.example.com:5432/iris_federation"),
                password="Password (if not in the URL)",
            ),
            _host_and_secret_form(
                "iris_airflow_provider.hooks.federation_peer.FederationPeerHook",
                "Iris Federation Peer",
                "irisfederationpeer",
                host=("Peer URL", "https://airflow.cw-east.example.com"),
                password="This cluster's private key (Ed25519 PEM)",
            ),
        ],
    }


def _host_and_secret_form(
    hook_class: str, hook_name: str, connection_type: str, *, host: tuple[str, str], password: str
) -> dict[str, Any]:
    """A connection type whose form keeps only the host (``host``: its label and an example) and the
    password (its label), kept encrypted like any connection password."""
    label, example = host
    return {
        "hook-class-name": hook_class,
        "hook-name": hook_name,
        "connection-type": connection_type,
        "ui-field-behaviour": {
            "hidden-fields": ["schema", "login", "port", "extra"],
            "relabeling": {"host": label, "password": password},
            "placeholders": {"host": example, "password": "kept encrypted, or in a secrets backend"},
        },
    }

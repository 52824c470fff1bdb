"""Where this deployment's cluster configuration comes from, read from Airflow's configuration
section ``[iris_federation]`` (``AIRFLOW__IRIS_FEDERATION__*``): one of ``cluster_config`` (a file),
``cluster_config_json`` (the document inline) or ``cluster_config_variable`` (an Airflow Variable
holding it, from the metadata database or a secrets backend); none: one local CPU backend, no peers."""

from __future__ import annotations

from airflow.providers.common.compat.sdk import conf

from iris_airflow_provider.cluster.config import ClusterConfig, load_cluster_config, parse_cluster_config_text
from iris_airflow_provider.core.errors import SpecError

SECTION = "iris_federation"
SOURCES = ("cluster_config", "cluster_config_json", "cluster_config_variable")


def cluster_config_source() -> tuple[str, str]:
    """Which option gives the cluster configuration, and its value; ``("", "")`` for the default."""
    given = [(option, value) for option in SOURCES if (value := conf.get(SECTION, option, fallback="") or "")]
    if len(given) > 1:
        raise SpecError.single(
            f"[{SECTION}]",
            f"set one of {', '.join(SOURCES)} to give the cluster configuration, not "
            f"{' and '.join(option for option, _ in given)}",
        )
    return given[0] if given else ("", "")


def cluster_config() -> ClusterConfig:
    option, value = cluster_config_source()
    if option == "cluster_config_json":
        return parse_cluster_config_text(value, source=f"[{SECTION}] cluster_config_json")
    if option == "cluster_config_variable":
        from airflow.providers.common.compat.sdk import Variable

        source = f"Airflow Variable {value!r} ([{SECTION}] cluster_config_variable)"
        text = Variable.get(value, default=None)
        if text is None:
            raise SpecError.single(source, "does not exist: create it with the cluster configuration")
        return parse_cluster_config_text(text, source=source)
    return load_cluster_config(value or None)

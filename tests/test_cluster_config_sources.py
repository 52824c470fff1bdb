"""Where a deployment's cluster configuration comes from: a file, the document inline in Airflow's
configuration, or an Airflow Variable (here from the environment secrets backend, ``AIRFLOW_VAR_*``,
looked up by Airflow itself as any other secrets backend would be)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.hooks import cluster_configuration as sources

DOCUMENT = {"name": "cw-east", "backends": [{"id": "gpu", "kind": "process", "devices": {"h100": 8}}]}


@pytest.fixture(autouse=True)
def no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in sources.SOURCES:
        monkeypatch.delenv(f"AIRFLOW__IRIS_FEDERATION__{option.upper()}", raising=False)


def test_the_configuration_comes_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(DOCUMENT))
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG", str(path))
    assert sources.cluster_config_source() == ("cluster_config", str(path))
    assert sources.cluster_config().name == "cw-east"


def test_the_configuration_comes_inline_from_airflows_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_JSON", json.dumps(DOCUMENT))
    config = sources.cluster_config()
    assert (config.name, [b.id for b in config.backends]) == ("cw-east", ["gpu"])


def test_the_configuration_comes_from_an_airflow_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_VARIABLE", "iris_cluster")
    monkeypatch.setenv("AIRFLOW_VAR_IRIS_CLUSTER", "name: cw-west\nbackends: [{id: cpu, kind: process}]\n")
    config = sources.cluster_config()
    assert (config.name, [b.id for b in config.backends]) == ("cw-west", ["cpu"])


def test_a_missing_variable_or_a_bad_document_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_VARIABLE", "iris_nowhere")
    with pytest.raises(SpecError) as missing:
        sources.cluster_config()
    assert str(missing.value) == (
        "Airflow Variable 'iris_nowhere' ([iris_federation] cluster_config_variable): does not exist: "
        "create it with the cluster configuration"
    )
    monkeypatch.setenv("AIRFLOW_VAR_IRIS_NOWHERE", json.dumps({**DOCUMENT, "nmae": "typo"}))
    with pytest.raises(SpecError, match=r"Variable .iris_nowhere. .*: unknown field\(s\) nmae; accepted: name,"):
        sources.cluster_config()
    monkeypatch.setenv("AIRFLOW_VAR_IRIS_NOWHERE", "[1, 2]")
    with pytest.raises(SpecError, match="must be a mapping"):
        sources.cluster_config()


def test_two_sources_at_once_are_refused_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG", str(tmp_path / "cluster.yaml"))
    monkeypatch.setenv("AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_VARIABLE", "iris_cluster")
    with pytest.raises(SpecError) as error:
        sources.cluster_config()
    assert str(error.value) == (
        "[iris_federation]: set one of cluster_config, cluster_config_json, cluster_config_variable to give the "
        "cluster configuration, not cluster_config and cluster_config_variable"
    )


def test_without_any_the_cluster_is_the_local_default() -> None:
    assert sources.cluster_config_source() == ("", "")
    assert sources.cluster_config().name == "local"

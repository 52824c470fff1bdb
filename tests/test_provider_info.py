"""The provider metadata Airflow reads: valid against Airflow's own schemas, and what it declares works."""

from __future__ import annotations

import json
import re
from importlib.metadata import entry_points
from pathlib import Path

import airflow
import jsonschema
import pytest

from iris_airflow_provider.get_provider_info import INTEGRATION, get_provider_info

AIRFLOW_PACKAGE = Path(airflow.__file__).parent
README = Path(__file__).resolve().parents[1] / "README.md"


def _schema(name: str) -> dict:
    return json.loads((AIRFLOW_PACKAGE / name).read_text())


def test_the_metadata_is_valid_against_airflows_provider_info_schema():
    jsonschema.validate(get_provider_info(), _schema("provider_info.schema.json"))


@pytest.mark.parametrize("key", ["connection-types", "integrations"])
def test_connection_types_and_integrations_match_the_stricter_provider_yaml_schema(key):
    """provider_info.schema.json leaves these entries open; provider.yaml's schema spells out their
    fields (ui-field-behaviour, conn-fields, integrations), so a misspelt key fails here."""
    jsonschema.validate(get_provider_info()[key], _schema("provider.yaml.schema.json")["properties"][key])


def test_hooks_operators_sensors_and_triggers_name_the_declared_integration():
    info = get_provider_info()
    assert [entry["integration-name"] for entry in info["integrations"]] == [INTEGRATION]
    named = {entry["integration-name"] for key in ("hooks", "operators", "sensors", "triggers") for entry in info[key]}
    assert named == {INTEGRATION}


def test_every_how_to_guide_points_at_a_readme_section():
    (integration,) = get_provider_info()["integrations"]
    headings = {_github_anchor(line.lstrip("#")) for line in README.read_text().splitlines() if line.startswith("#")}
    for guide in integration["how-to-guide"]:
        path, _, anchor = guide.partition("#")
        assert path == "/README.md" and anchor in headings, guide


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_connection_type_has_a_hook_name_and_a_declared_form():
    for connection_type in get_provider_info()["connection-types"]:
        assert connection_type["hook-name"]
        assert connection_type["ui-field-behaviour"]["hidden-fields"]


def test_the_plugin_is_registered_once_by_its_entry_point_not_in_the_metadata():
    assert "plugins" not in get_provider_info()  # eager discovery would register it a second time
    ours = [ep for ep in entry_points(group="airflow.plugins") if ep.value.startswith("iris_airflow_provider.")]
    assert [(ep.name, ep.value) for ep in ours] == [
        ("iris_federation", "iris_airflow_provider.plugins.iris_federation:IrisFederationPlugin")
    ]


def test_the_wake_assets_scheme_is_registered_so_airflow_normalizes_its_uri():
    from iris_airflow_provider.dags.iris_federation_tick import wake

    assert {"schemes": ["iris-federation"], "handler": None} in get_provider_info()["asset-uris"]
    assert wake.uri == "iris-federation://wake/"
    assert wake.normalized_uri == "iris-federation://wake/"  # None for a scheme no provider registers


def test_airflows_providers_manager_reads_the_connection_form_without_the_hook():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    (meta,) = [m for m in manager.iter_connection_type_hook_ui_metadata() if m.connection_type == "irisfederation"]
    assert meta.hook_name == "Iris Federation Store"
    assert meta.field_behaviour is not None
    assert set(meta.field_behaviour["hidden_fields"]) == {"schema", "login", "port", "extra"}
    assert meta.field_behaviour["relabeling"] == {"host": "SQLAlchemy URL", "password": "Password (if not in the URL)"}

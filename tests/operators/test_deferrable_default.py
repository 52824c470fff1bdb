"""Whether the operator and the sensor defer unless told: ``[iris_federation] default_deferrable``,
and when that is unset, Airflow's ``[operators] default_deferrable``."""

from __future__ import annotations

import pytest

from iris_airflow_provider.operators.federated import IrisFederatedOperator
from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor

OURS = "AIRFLOW__IRIS_FEDERATION__DEFAULT_DEFERRABLE"
AIRFLOWS = "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"


def _defaults() -> tuple[bool, bool]:
    operator = IrisFederatedOperator(task_id="run", job={"command": "true"})
    sensor = IrisFederatedJobSensor(task_id="wait", job_id="/alice/x")
    return operator.deferrable, sensor.deferrable


@pytest.mark.parametrize("airflows", ["True", "False"])
def test_unset_it_follows_airflows_operators_default_deferrable(monkeypatch, airflows):
    monkeypatch.delenv(OURS, raising=False)
    monkeypatch.setenv(AIRFLOWS, airflows)
    assert _defaults() == (airflows == "True",) * 2


def test_unset_everywhere_it_is_airflows_default_not_deferrable(monkeypatch):
    monkeypatch.delenv(OURS, raising=False)
    monkeypatch.delenv(AIRFLOWS, raising=False)
    assert _defaults() == (False, False)


@pytest.mark.parametrize(("ours", "airflows"), [("True", "False"), ("False", "True")])
def test_set_it_wins_over_airflows(monkeypatch, ours, airflows):
    monkeypatch.setenv(OURS, ours)
    monkeypatch.setenv(AIRFLOWS, airflows)
    assert _defaults() == (ours == "True",) * 2


def test_an_explicit_argument_wins_over_both(monkeypatch):
    monkeypatch.setenv(OURS, "True")
    monkeypatch.setenv(AIRFLOWS, "True")
    assert IrisFederatedOperator(task_id="run", job={"command": "true"}, deferrable=False).deferrable is False


def test_a_value_that_is_not_a_boolean_is_refused_naming_the_option(monkeypatch):
    from airflow.providers.common.compat.sdk import AirflowConfigException

    monkeypatch.setenv(OURS, "maybe")
    with pytest.raises(AirflowConfigException, match='"default_deferrable" key in "iris_federation" section'):
        _defaults()

"""The sensor holds the job id it watches to the one job id rule, once rendered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import DAG

from iris_airflow_provider.sensors.federated import IrisFederatedJobSensor


@pytest.mark.parametrize("job_id", ["/../..", "/alice/train\x00", "alice/train"])
def test_an_invalid_job_id_fails_the_sensor_before_it_reads_anything(job_id: str) -> None:
    with DAG(dag_id="watch", schedule=None):
        sensor = IrisFederatedJobSensor(task_id="wait", job_id=job_id, conn_id="no_such_connection")
    pushed: list[str] = []
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.append(key))
    with pytest.raises(AirflowFailException, match=r"^Invalid job_id: must look like /<user>/<name>"):
        sensor.execute({"ti": ti})  # type: ignore[arg-type]
    assert pushed == []  # nothing recorded for it, not even the link

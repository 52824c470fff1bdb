"""The extra link from a task to its job on the Federation page."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseOperatorLink
from airflow.sdk.bases.xcom import BaseXCom

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

JOB_ID_XCOM_KEY = "iris_federation_job_id"
PAGE_ROUTE = "iris-federation"


def job_url(job_id: str) -> str:
    """Where the Federation page shows ``job_id``: ``<base_url>/plugin/iris-federation?job=<job id>``."""
    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}/plugin/{PAGE_ROUTE}?job={quote(job_id, safe='')}"


class FederationJobLink(BaseOperatorLink):
    name = "Federation"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # Airflow's TaskInstanceKey satisfies TIKeyProtocol at runtime; its fields are read-only for mypy.
        job_id = BaseXCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM_KEY)  # type: ignore[arg-type]
        return job_url(job_id) if job_id else ""

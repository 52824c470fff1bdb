"""The serving URLs of a job this cluster runs, for the task log and XCom (``services/serving.py``)."""

from __future__ import annotations

from typing import Any

from iris_airflow_provider.hooks.serving import get_serving
from iris_airflow_provider.store.records import JobRecord

SERVING_URLS_XCOM_KEY = "serving_urls"


def serving_urls(job: JobRecord, log: Any) -> dict[str, str]:
    """Each named port's capability URL (minted now, by this cluster), logged one per line; {} for a
    job without ports or one that runs elsewhere. A cluster that cannot mint says why, once."""
    if not job.spec.get("ports"):
        return {}
    try:
        urls = get_serving().urls(job)
    except (OSError, ValueError) as error:
        log.warning("Cannot mint the serving URLs of job %s: %s", job.job_id, error)
        return {}
    if not urls and get_serving().secret is None:
        log.warning(
            "Job %s declares ports, but this cluster mints no serving URLs: set serving.token_secret "
            "(or federation.private_key) in its cluster configuration",
            job.job_id,
        )
    for name, url in urls.items():
        # Airflow masks the token (a JWT) in task logs: the whole URL is in XCom and on the job's page.
        log.info("Serving port %s of job %s at %s (XCom serving_urls holds it unmasked)", name, job.job_id, url)
    return urls

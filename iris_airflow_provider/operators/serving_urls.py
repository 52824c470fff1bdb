"""The serving URLs of a job, for the task log, XCom and the job's page: minted now by this cluster for
a job it runs (``services/serving.py``), or as the peer running a job handed to it minted them (kept
by the sync once checked: ``core/serving.py``'s ``accepted_serving_urls``)."""

from __future__ import annotations

from typing import Any

from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.hooks.serving import get_serving
from iris_airflow_provider.store.records import JobRecord

SERVING_URLS_XCOM_KEY = "serving_urls"


def current_serving_urls(job: JobRecord) -> dict[str, str]:
    """Each named port's URL while the job's incarnation runs; {} for a finished job or one without
    ports. Raises OSError or ValueError when this cluster cannot read its token secret."""
    if not job.spec.get("ports") or job.terminal:
        return {}
    if job.direction is Direction.SENT:
        return dict(job.serving_urls or {})
    return get_serving().urls(job)


def serving_urls(job: JobRecord, log: Any) -> dict[str, str]:
    """:func:`current_serving_urls`, logged one per line. A cluster that cannot mint says why, once."""
    if not job.spec.get("ports"):
        return {}
    try:
        urls = current_serving_urls(job)
    except (OSError, ValueError) as error:
        log.warning("Cannot mint the serving URLs of job %s: %s", job.job_id, error)
        return {}
    if not urls and job.direction is not Direction.SENT and not job.terminal and get_serving().secret is None:
        log.warning(
            "Job %s declares ports, but this cluster mints no serving URLs: set serving.token_secret "
            "(or federation.private_key) in its cluster configuration",
            job.job_id,
        )
    for name, url in urls.items():
        # Airflow masks the token (a JWT) in task logs: the whole URL is in XCom and on the job's page.
        log.info("Serving port %s of job %s at %s (XCom serving_urls holds it unmasked)", name, job.job_id, url)
    return urls

"""``IrisReceivedJobOperator``: runs a job another cluster handed to this one, and waits for it.

The peer API admitted and started the job; this task makes sure it is started (idempotently, by
its incarnation), waits for it in the triggerer, and ends as the job ends. It is a mirror for this
cluster's operators, never the job's owner: nothing that happens to the task or its run (a kill, a
reset of an orphaned task, a retry, a clear, mark failed, a scheduler failing over) ends the job.
Only the parent that handed it over ends it, or an operator here explicitly, with Cancel on the
Federation page or ``airflow iris-federation cancel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.sdk import BaseOperator

from iris_airflow_provider.core.orphans import KillAction, kill_message
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.hooks.runtime import default_conn_id, get_federation
from iris_airflow_provider.links.job_page import JOB_ID_XCOM_KEY, FederationJobLink, job_url
from iris_airflow_provider.operators.job_outcome import describe_record
from iris_airflow_provider.operators.serving_urls import SERVING_URLS_XCOM_KEY, serving_urls
from iris_airflow_provider.triggers.federation import DEFAULT_POLL_INTERVAL, FederationJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class IrisReceivedJobOperator(BaseOperator):
    template_fields: Sequence[str] = ("job_id", "nonce")
    operator_extra_links = (FederationJobLink(),)
    # Amber: a job another cluster handed over, mirrored here (the submitting operator is blue).
    ui_color = "#fbe7c6"
    ui_fgcolor = "#5c3b00"

    def __init__(
        self,
        *,
        job_id: str,
        nonce: str,
        conn_id: str | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.nonce = nonce
        self.conn_id = conn_id or default_conn_id()
        self.poll_interval = poll_interval

    def execute(self, context: Context) -> Any:
        # The Federation link opens the job, while the task waits too (as the operator and sensor do).
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=self.job_id)
        context["ti"].xcom_push(key=FederationJobLink().xcom_key, value=job_url(self.job_id))
        job = get_federation(self.conn_id).start_received(self.job_id, self.nonce)
        self.log.info("Job %s, handed off by %s: %s", job.job_id, job.peer_id, describe_record(job))
        urls = serving_urls(job, self.log)
        if urls:
            context["ti"].xcom_push(key=SERVING_URLS_XCOM_KEY, value=urls)
        if job.terminal:
            return self._finish()
        self.defer(
            trigger=FederationJobTrigger(
                self.job_id, conn_id=self.conn_id, poll_interval=self.poll_interval, kill_action=KillAction.IGNORE
            ),
            method_name="execute_complete",
        )
        return None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        job = get_federation(self.conn_id).store.get_job(self.job_id)
        if job is None or job.nonce != self.nonce:
            raise AirflowFailException(f"Job {self.job_id} (incarnation {self.nonce}) is no longer here")
        result = {"job_id": job.job_id, "requester": job.peer_id, "state": job.state.value, "exit_code": job.exit_code}
        if job.state is JobState.SUCCEEDED:
            return result
        # The job's outcome is final: task retries are for this task's own troubles, not the job's.
        raise AirflowFailException(describe_record(job))

    def on_kill(self) -> None:
        self.log.info(kill_message(KillAction.IGNORE, self.job_id))

"""``IrisFederatedJobSensor``: wait until a federated job is accepted by a peer, running, or finished.

Deferrable by default: the wait happens in the triggerer, through the same shared poller as the
operator. A job that ends badly fails the sensor with the reason (the peer's, when it has one).
Killing the sensor never cancels the job: it only watches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException
from airflow.sdk import BaseSensorOperator

from iris_airflow_provider.core.job_ids import JobIdError, check_job_id
from iris_airflow_provider.core.orphans import KillAction
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.hooks.runtime import default_conn_id, default_deferrable, get_federation
from iris_airflow_provider.links.job_page import JOB_ID_XCOM_KEY, FederationJobLink, job_url
from iris_airflow_provider.operators.job_outcome import describe_record, snapshot_of
from iris_airflow_provider.triggers.federation import DEFAULT_POLL_INTERVAL, WAIT_UNTIL, FederationJobTrigger, reached

if TYPE_CHECKING:
    from airflow.sdk import Context


class IrisFederatedJobSensor(BaseSensorOperator):
    """:param job_id: the job to watch (templated). :param until: ``accepted``, ``running`` or ``completion``.
    :param watch_dag_ids: besides its own DAG's, the DAGs whose jobs this sensor may watch (not
        templated: the DAG's author decides, not a run's ``conf``). A job submitted by any other
        DAG is treated as missing, so a run cannot peek at another user's job by naming its id.
    """

    template_fields: Sequence[str] = ("job_id",)
    operator_extra_links = (FederationJobLink(),)
    # The submitting operator's blue, lighter: it watches a job, it does not own one.
    ui_color = "#eaf3fb"
    ui_fgcolor = "#0b3d66"

    def __init__(
        self,
        *,
        job_id: str,
        until: str = "completion",
        conn_id: str | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        deferrable: bool | None = None,
        watch_dag_ids: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        if until not in WAIT_UNTIL:
            raise ValueError(f"until must be one of {', '.join(WAIT_UNTIL)}, got {until!r}")
        self.job_id = job_id
        self.until = until
        self.conn_id = conn_id or default_conn_id()
        self.poll_interval = float(poll_interval)
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.watch_dag_ids = tuple(watch_dag_ids)

    def poke(self, context: Context) -> bool:
        job = get_federation(self.conn_id).store.get_job(self.job_id)
        watchable = {context["ti"].dag_id, *self.watch_dag_ids}
        if job is None or job.origin is None or job.origin.dag_id not in watchable:
            raise AirflowException(
                f"Job {self.job_id} is not in the federation store, or was not submitted by this DAG "
                "(or one in the sensor's watch_dag_ids)"
            )
        self.log.info(describe_record(job))
        if job.terminal:
            self._raise_if_bad(job.state, describe_record(job))
            return True
        return reached(snapshot_of(job), self.until)

    def execute(self, context: Context) -> Any:
        try:
            check_job_id(self.job_id)  # rendered now: the rule every job id entering the federation meets
        except JobIdError as error:
            raise AirflowFailException(f"Invalid job_id: {error}") from None
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=self.job_id)
        context["ti"].xcom_push(key=FederationJobLink().xcom_key, value=job_url(self.job_id))
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        self.defer(
            trigger=FederationJobTrigger(
                self.job_id,
                until=self.until,
                conn_id=self.conn_id,
                poll_interval=self.poll_interval,
                kill_action=KillAction.IGNORE,  # it only watches: the job is not its to end
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout or (None if self.timeout is None else _seconds(self.timeout)),
        )
        return None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        if event.get("status") != "reached":
            raise AirflowException(event.get("message", f"Waiting on job {self.job_id} failed"))
        self._raise_if_bad(JobState(event["state"]), event["message"])

    @staticmethod
    def _raise_if_bad(state: JobState, message: str) -> None:
        if state is JobState.FAILED:
            raise AirflowException(message)
        if state in (JobState.KILLED, JobState.UNSCHEDULABLE):
            raise AirflowFailException(message)


def _seconds(timeout: Any) -> Any:
    from datetime import timedelta

    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))

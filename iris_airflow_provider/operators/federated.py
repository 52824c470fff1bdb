"""``IrisFederatedOperator``: submit one whole job to the federation and wait for it.

The job is classified once: it runs on this cluster's backend (LOCAL), waits in the federation
queue for a peer with free capacity (QUEUE), or fails now with the reason no backend or peer can
host it (REJECT). Waiting happens in the triggerer (deferrable) or on the worker.
The job id is derived from the task instance, so a retry or a restarted worker reattaches to the
job instead of submitting a second one (through Airflow 3.3's task state store as well), and ends
exactly as a first run would: with the job's result, or its failure. Killing the task does not
cancel the job by itself (``cancel_on_kill``): a kill looks the same whether a user marked the task
failed or its worker is going away, so the placement tick decides from the task's recorded state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException
from airflow.sdk import BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowTaskTimeout

from iris_airflow_provider.core import job_ids
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.orphans import submitter_kill_action
from iris_airflow_provider.core.ownership import OwnershipError, user_namespace
from iris_airflow_provider.core.router import Disposition
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.hooks.runtime import default_conn_id, default_deferrable, get_bundle_store, get_federation
from iris_airflow_provider.links.job_page import JOB_ID_XCOM_KEY, FederationJobLink, job_url
from iris_airflow_provider.operators.job_document import JOB_FILE_EXTENSIONS, job_spec, render_job, workdir_path
from iris_airflow_provider.operators.job_outcome import describe_record, disposition, outcome, snapshot_of
from iris_airflow_provider.operators.serving_urls import SERVING_URLS_XCOM_KEY, serving_urls
from iris_airflow_provider.services.submit import IdentityError
from iris_airflow_provider.store.records import JobRecord, Origin
from iris_airflow_provider.triggers.federation import DEFAULT_POLL_INTERVAL, FederationJobTrigger

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

WAIT_FOR = ("completion", "acceptance", "none")
ACTIVE = (JobState.PENDING.value, JobState.ACCEPTED.value, JobState.RUNNING.value)
# Trigger deadlines fire before Airflow's own defer timeout, so the job is cancelled, not orphaned.
DEFER_TIMEOUT_GRACE = timedelta(seconds=60)


class IrisFederatedOperator(ResumableJobMixin, BaseOperator):
    """Run a whole job on this cluster or on a federation peer, and wait for it.

    :param job: the job: a dict (or its JSON or YAML text), a ``JobSpec``, or the name of a job file
        beside the DAG (``.json``, ``.yaml``, ``.yml``). Templated, always to native objects, so a
        REST-triggered run can pass it in ``conf`` (``job="{{ params.job }}"`` is the dict itself);
        a job file is rendered by Jinja, then parsed. Without a
        ``job_id`` the job is ``/<submitter>/<dag_id>.<task_id>.<run_id>[.<map_index>]``. A given
        ``job_id`` must be in the submitter's namespace, ``/<submitter>/<name>`` (a bare ``<name>``
        is placed there); it belongs to this DAG and task, so only they reattach to or re-run it.
    :param target_cluster: pin the job to this peer (templated); it queues there even when it
        could run locally.
    :param submitter: the accountable user for scheduled runs; REST and UI runs use the
        triggering user. A job that would federate needs one. An explicit submitter must be allowed
        for this DAG by the cluster file's ``federation.service_principals``, else the task fails
        before anything is written.
    :param workdir: a directory whose files travel with the job into its working directory (the
        code it runs, its inputs); relative to the DAG file's folder; templated. The job's own
        ``files`` win over the directory's. Within the limits of ``files`` it travels inline;
        beyond them it is packed into a content-addressed bundle (this cluster's ``bundles:``,
        at most ``bundles.max_bundle_bytes``, 1 GiB by default) and uploaded to the peer once.
    :param wait_for: ``completion`` (default), ``acceptance`` (a peer admitted it, or it runs
        locally), or ``none`` (return right after it is queued or started).
    :param poll_interval: seconds between looks at the job while waiting.
    :param conn_id: the federation store's connection.
    :param deferrable: wait in the triggerer (default: ``[iris_federation] default_deferrable``, or
        when that is unset Airflow's ``[operators] default_deferrable``).
    :param cancel_on_kill: cancel the job whenever the task is killed, for whatever reason (a
        worker shutting down too), on the worker or in the triggerer. Default False: a kill leaves
        the job running, and the placement tick cancels it only once the task has failed (marked
        failed, its DAG run marked failed, or out of retries), so a restarted worker, a retry or a
        cleared task reattaches to it.
    """

    template_fields: Sequence[str] = ("job", "target_cluster", "submitter", "workdir")
    template_ext: Sequence[str] = JOB_FILE_EXTENSIONS
    template_fields_renderers: ClassVar[dict[str, str]] = {"job": "json"}
    operator_extra_links = (FederationJobLink(),)
    external_id_key = "iris_federation_job"
    ui_color = "#d5e8f7"

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | JobSpec | str,
        target_cluster: str | None = None,
        submitter: str | None = None,
        workdir: str | None = None,
        wait_for: str = "completion",
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        conn_id: str | None = None,
        deferrable: bool | None = None,
        cancel_on_kill: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if wait_for not in WAIT_FOR:
            raise ValueError(f"wait_for must be one of {', '.join(WAIT_FOR)}, got {wait_for!r}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.job = job
        self.target_cluster = target_cluster
        self.submitter = submitter
        self.workdir = workdir
        self.wait_for = wait_for
        self.poll_interval = float(poll_interval)
        self.conn_id = conn_id or default_conn_id()
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.cancel_on_kill = cancel_on_kill
        self.job_id: str | None = None
        self._announced: str | None = None  # the job whose ids this try has pushed to XCom
        self._serving_announced = ""  # the incarnation whose serving URLs this try has logged and pushed

    # Rendering -------------------------------------------------------------------------------------

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        """The job itself renders to a native object whatever the DAG's ``render_template_as_native_obj``
        (``{{ params.job }}`` is the dict, not its repr); strings inside a job render to text (its fields
        are text: ``{{ params.steps }}`` in ``env`` is ``"1000"``, not ``1000``). Only the job itself may
        name a job file: a string inside it ending in ``.yaml`` (a command's argument) stays a string."""
        others = [field for field in self.template_fields if field != "job"]
        self._do_render_template_fields(self, others, context, jinja_env or self.get_template_env(), set())
        if self.job:
            self.job = render_job(self.job, context, lambda native: self._template_env(native=native))

    def _template_env(self, *, native: bool) -> jinja2.Environment:
        """The DAG's Jinja environment (its folder, searchpath, macros, filters), native or text."""
        explicit = self.render_template_as_native_obj
        self.render_template_as_native_obj = native
        try:
            return self.get_template_env(dag=self.get_dag())
        finally:
            self.render_template_as_native_obj = explicit

    # What to submit --------------------------------------------------------------------------------

    def submitting_user(self, context: Context) -> str:
        if self.submitter:
            return self.submitter
        dag_run = context.get("dag_run")
        return (getattr(dag_run, "triggering_user_name", None) or "") if dag_run is not None else ""

    def job_spec(self, context: Context) -> JobSpec:
        """The rendered job, validated; a bad field fails the task (without retries) before any write."""
        workdir = None
        if self.workdir:
            workdir = workdir_path(str(self.workdir), getattr(context.get("dag"), "fileloc", None))
        return job_spec(
            self.job,
            user=self.submitting_user(context),
            derived_job_id=lambda: self.derived_job_id(context),
            target_cluster=self.target_cluster,
            workdir=workdir,
            bundle_store=lambda: get_bundle_store(self.conn_id),
        )

    def derived_job_id(self, context: Context) -> str:
        """``/<submitter>/<dag_id>.<task_id>.<run_id>[.<map_index>]``, made to pass the job id rule."""
        ti = context["ti"]
        name = f"{ti.dag_id}.{ti.task_id}.{ti.run_id}"
        if getattr(ti, "map_index", -1) not in (-1, None):
            name += f".{ti.map_index}"
        return job_ids.derived_job_id(user_namespace(self.submitting_user(context)), name)

    # The resumable job -----------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        result = self.execute_resumable(context)
        if result is None:
            # Reconnecting to a live job, ResumableJobMixin returns what poll_until_complete returns
            # (nothing: it only waits), where a first run goes on to get_job_result. End the same way.
            assert self.job_id is not None  # poll_until_complete set it
            return self.get_job_result(self.job_id, context)
        return result

    def submit_job(self, context: Context) -> str:
        ti = context["ti"]
        federation = get_federation(self.conn_id)
        try:
            if self.submitter:  # the triggering user is always accepted; an explicit one only where allowed
                federation.check_service_principal(self.submitter, ti.dag_id)
        except IdentityError as error:
            raise AirflowFailException(str(error)) from None
        spec = self.job_spec(context)
        try:
            submitted = federation.submit(
                spec,
                submitting_user=self.submitting_user(context),
                origin=Origin(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1)),
            )
        except (IdentityError, OwnershipError) as error:
            raise AirflowFailException(str(error)) from None
        decision = submitted.decision
        if decision.disposition is Disposition.REJECT or submitted.job is None:
            raise AirflowFailException(decision.reason)
        self.job_id = spec.job_id
        verb = "Reattached to" if submitted.reattached else "Submitted"
        self.log.info(
            "%s job %s: %s. Federation page: %s",
            verb,
            spec.job_id,
            describe_record(submitted.job),
            job_url(spec.job_id),
        )
        self._announce(submitted.job, context)
        return spec.job_id

    def _announce(self, job: JobRecord, context: Context) -> None:
        """Push the job's ids for this try (a new try starts with no XCom), once: a reconnecting try too."""
        if self._announced == job.job_id:
            return
        ti = context["ti"]
        ti.xcom_push(key=JOB_ID_XCOM_KEY, value=job.job_id)
        ti.xcom_push(key="disposition", value=disposition(job))
        ti.xcom_push(key=FederationJobLink().xcom_key, value=job_url(job.job_id))  # visible while deferred
        self._announce_serving(job, context)
        self._announced = job.job_id

    def _announce_serving(self, job: JobRecord, context: Context) -> None:
        """Log the job's serving URLs and push them to XCom, once per incarnation: a job handed to a
        peer has them only once it runs there (the peer mints them), so they may come later."""
        if self._serving_announced == job.nonce:
            return
        urls = serving_urls(job, self.log)
        if urls:
            context["ti"].xcom_push(key=SERVING_URLS_XCOM_KEY, value=urls)
            self._serving_announced = job.nonce

    def get_job_status(self, external_id: Any, context: Context) -> str:
        job = get_federation(self.conn_id).store.get_job(str(external_id))
        return job.state.value if job is not None else "missing"

    def is_job_active(self, status: str) -> bool:
        return status in ACTIVE

    def is_job_succeeded(self, status: str) -> bool:
        return status == JobState.SUCCEEDED.value

    def poll_until_complete(self, external_id: Any, context: Context) -> None:
        self.job_id = job_id = str(external_id)
        if self._announced != job_id:  # reconnecting: this try has not said which job it waits for
            job = get_federation(self.conn_id).store.get_job(job_id)
            if job is not None:
                self.log.info(
                    "Reattached to job %s: %s. Federation page: %s", job_id, describe_record(job), job_url(job_id)
                )
                self._announce(job, context)
        if self.wait_for == "none":
            return
        until = "completion" if self.wait_for == "completion" else "accepted"
        if self.deferrable:
            self._defer(job_id, context)
        self._wait_on_worker(job_id, until, context)

    def _defer(self, job_id: str, context: Context, *, log_after_seq: int = 0) -> None:
        """Wait in the triggerer; it also wakes the task when a handed-off job's serving URLs arrive
        (``serving`` event), which then announces them and waits again."""
        until = "completion" if self.wait_for == "completion" else "accepted"
        deadline_ms = self._deadline_ms(context)
        timeout = None
        if deadline_ms is not None:
            timeout = timedelta(milliseconds=max(0, deadline_ms - time.time() * 1000)) + DEFER_TIMEOUT_GRACE
        self.defer(
            trigger=FederationJobTrigger(
                job_id,
                until=until,
                conn_id=self.conn_id,
                poll_interval=self.poll_interval,
                deadline_ms=deadline_ms,
                kill_action=submitter_kill_action(self.cancel_on_kill),
                announce_serving=until == "completion",
                serving_announced=self._serving_announced,
                log_after_seq=log_after_seq,
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def get_job_result(self, external_id: Any, context: Context) -> dict[str, Any]:
        return self._finish(str(external_id), context)

    # Resuming and finishing ------------------------------------------------------------------------

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.job_id = job_id = event["job_id"]
        status = event.get("status")
        if status == "timeout":
            get_federation(self.conn_id).cancel(job_id)
            raise AirflowTaskTimeout(f"Timed out waiting for job {job_id}, so it was cancelled: {event['message']}")
        if status == "missing":
            raise AirflowException(event["message"])
        if status == "serving":  # the peer running the job reported its serving URLs: say so, wait on
            self._serving_announced = str(event.get("announced") or "")  # by an earlier resumption
            job = get_federation(self.conn_id).store.get_job(job_id)
            if job is not None and not job.terminal:
                self._announce_serving(job, context)
                if job.nonce == event.get("nonce"):  # announced now (or nothing left to): not again for it
                    self._serving_announced = job.nonce
                self._defer(job_id, context, log_after_seq=int(event.get("log_seq") or 0))
        return self._finish(job_id)

    def _finish(self, job_id: str, context: Context | None = None) -> dict[str, Any]:
        store = get_federation(self.conn_id).store
        job = store.get_job(job_id)
        if job is None:
            raise AirflowException(f"Job {job_id} is not in the federation store")
        if context is not None:
            self._announce(job, context)  # a try that found its job already finished says which it was
        return outcome(store, job)

    def _wait_on_worker(self, job_id: str, until: str, context: Context) -> None:
        from iris_airflow_provider.triggers.federation import reached

        store = get_federation(self.conn_id).store
        last = ""
        try:
            while True:
                job = store.get_job(job_id)
                if job is None:
                    raise AirflowException(f"Job {job_id} is not in the federation store")
                now = describe_record(job)
                if now != last:
                    self.log.info(now)
                    last = now
                if job.terminal or reached(snapshot_of(job), until):
                    return
                if job.serving_urls:  # a handed-off job's peer reported them: once per incarnation
                    self._announce_serving(job, context)
                time.sleep(self.poll_interval)
        except AirflowTaskTimeout:
            get_federation(self.conn_id).cancel(job_id)
            raise

    def _deadline_ms(self, context: Context) -> int | None:
        if self.execution_timeout is None:
            return None
        start = getattr(context["ti"], "start_date", None)
        started_ms = start.timestamp() * 1000 if start is not None else time.time() * 1000
        return int(started_ms + self.execution_timeout.total_seconds() * 1000)

    def on_kill(self) -> None:
        """Airflow 3.3 calls this on SIGTERM, whoever sent it: the API server (through the supervisor's
        heartbeat) after a user marked the task failed, success or cleared it, or the scheduler reset
        it; the worker shutting down (the supervisor forwards its own SIGTERM); or execution_timeout.
        Which it was shows only in the task's recorded state, so unless ``cancel_on_kill`` this
        cancels nothing and asks the placement tick to check that state now (see ``core.orphans``)."""
        if self.job_id:
            self.log.info(
                get_federation(self.conn_id).task_killed(self.job_id, submitter_kill_action(self.cancel_on_kill))
            )

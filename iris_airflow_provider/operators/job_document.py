"""From the ``job`` a DAG gives ``IrisFederatedOperator`` to a validated ``JobSpec``: the job rendered by
Jinja (to native objects, or read from a job file beside the DAG), text parsed as JSON or YAML, its id
placed in the submitter's namespace, and a ``workdir`` packed in (inline as ``files``, or as a bundle).
Every refusal fails the task without retries, before anything is written."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowFailException

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.ownership import OwnershipError, check_namespace, qualified_job_id
from iris_airflow_provider.operators.workdir import WorkdirError, WorkdirTooLargeError, bundle_workdir, pack_workdir

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

    from iris_airflow_provider.backends.bundles import BundleStore

# A job given as a file name (beside the DAG, or on its template_searchpath) is read and rendered by Jinja.
JOB_FILE_EXTENSIONS = (".json", ".yaml", ".yml")


def render_job(job: Any, context: Context, template_env: Callable[[bool], jinja2.Environment]) -> Any:
    """The job rendered: a mapping's strings to text (its fields are text: ``{{ params.steps }}`` in
    ``env`` is ``"1000"``), a string to a native object (``{{ params.job }}`` is the dict), a job file
    name to its rendered content. ``template_env(native)`` is the DAG's Jinja environment."""
    from airflow.sdk.definitions.context import render_template_as_native, render_template_to_string
    from jinja2 import TemplateNotFound

    if not isinstance(job, str):
        text_env = template_env(False)

        def text(value: Any) -> Any:
            if isinstance(value, str):
                return render_template_to_string(text_env.from_string(value), context)
            if isinstance(value, Mapping):
                return {key: text(item) for key, item in value.items()}
            if isinstance(value, list | tuple):
                return [text(item) for item in value]
            return value

        return text(job)
    env = template_env(True)
    if not job.endswith(JOB_FILE_EXTENSIONS):
        return render_template_as_native(env.from_string(job), context)
    try:
        template = env.get_template(job)
    except TemplateNotFound:
        searched = getattr(env.loader, "searchpath", [])
        raise AirflowFailException(
            f"Invalid job:\njob: no job file {job!r} beside the DAG or on its template_searchpath "
            f"(searched {', '.join(map(str, searched)) or 'nothing'})"
        ) from None
    return render_template_as_native(template, context)


def job_spec(
    job: Mapping[str, Any] | JobSpec | str,
    *,
    user: str,
    derived_job_id: Callable[[], str],
    target_cluster: str | None = None,
    workdir: Path | None = None,
    bundle_store: Callable[[], BundleStore],
) -> JobSpec:
    """The rendered job, validated: ``target_cluster`` pins it, a given job id must be in ``user``'s
    namespace (a bare name is placed there), else the id is ``derived_job_id()``; ``workdir``'s files
    travel with it (the job's own ``files`` win)."""
    document = _as_document(job)
    if isinstance(document, JobSpec):
        document = document.model_dump(mode="json")
    document = dict(document)
    if target_cluster:
        document["target_cluster"] = target_cluster
    if document.get("job_id"):
        document["job_id"] = qualified_job_id(str(document["job_id"]), user)
        try:
            check_namespace(document["job_id"], user)
        except OwnershipError as error:
            raise AirflowFailException(f"Invalid job:\n{error}") from None
    else:
        document["job_id"] = derived_job_id()
    if workdir is not None:
        try:
            try:
                document["files"] = {**pack_workdir(workdir), **(document.get("files") or {})}
            except WorkdirTooLargeError:
                # Too big to travel inline: one bundle of the directory and the job's own files,
                # packed once the rest of the job is known to be valid.
                own = _parsed(document).files
                document["bundle"] = bundle_workdir(workdir, bundle_store(), own).model_dump()
                document["files"] = {}
        except (WorkdirError, OSError) as error:
            raise AirflowFailException(f"Invalid job:\n{error}") from None
    spec = _parsed(document)
    if spec.bundle is not None and not bundle_store().has(spec.bundle):
        raise AirflowFailException(  # a bundle named by hand must be one this cluster holds
            f"Invalid job:\njob.bundle: {spec.bundle.digest} ({spec.bundle.size} bytes) is not in this cluster's "
            "bundle store (bundles.dir); give the operator workdir= to pack one"
        )
    return spec


def _parsed(document: Mapping[str, Any]) -> JobSpec:
    try:
        return parse_job(document, path="job")
    except SpecError as error:
        raise AirflowFailException(f"Invalid job:\n{error}") from None


def workdir_path(workdir: str, dag_fileloc: str | None) -> Path:
    """``workdir`` as given, a relative one taken from the DAG file's folder."""
    path = Path(workdir).expanduser()
    return path if path.is_absolute() or not dag_fileloc else Path(dag_fileloc).parent / path


def _as_document(job: Mapping[str, Any] | JobSpec | str) -> Mapping[str, Any] | JobSpec:
    """The job as a mapping: rendered text (a job file, ``| tojson``) is parsed as JSON, else as YAML."""
    if not isinstance(job, str):
        document: Any = job
    else:
        import yaml

        text = job.strip()
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            try:
                document = yaml.safe_load(text)
            except yaml.YAMLError as error:
                raise AirflowFailException(
                    f"Invalid job:\njob: not valid JSON or YAML ({error}); got {text[:200]!r}. Pass a dict, "
                    "a job file (.json, .yaml, .yml) beside the DAG, or its JSON or YAML text"
                ) from None
    if not isinstance(document, Mapping | JobSpec):
        raise AirflowFailException(
            "Invalid job:\njob: expected an object (a dict, or JSON or YAML text of one), "
            f"got {type(document).__name__}"
        )
    return document

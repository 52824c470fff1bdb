"""The ``kubernetes`` backend: one batch/v1 Job per federated job, on a cluster run by Kueue.

Reached through an Airflow connection of type ``kubernetes`` (the cncf-kubernetes provider's
``KubernetesHook``, and ``AsyncKubernetesHook`` for the read-only calls a trigger may make).

- **Capacity** (the heartbeat) comes from nodes and pods, through the pure
  :func:`~iris_airflow_provider.backends.kubernetes_capacity.cluster_capacity`.
- **A job** is an Indexed Job (``completions = parallelism = replicas``, ``backoffLimit: 0``:
  retries are the federation's, as new incarnations), named after the job id, labelled with a
  digest of the job id, the nonce, the requesting cluster and the band, carrying the Kueue
  ``queue-name`` label (created suspended: Kueue unsuspends it on admission) and the band's
  PriorityClass. GPUs are requested as ``nvidia.com/gpu`` on nodes of the job's variant. Workdir
  files travel in a ConfigMap (or Secret) owned by the Job, mounted file by file into a writable
  ``/iris/workdir``; a job whose files do not fit is refused.
- **Creating is idempotent by nonce**: the Job name is derived from the job id, so the API server
  itself makes two creates of one job collide; the same nonce is a replay, another live one is
  ``already exists``, a finished one is replaced.
- **Status**: suspended or gated -> pending (awaiting acceptance); admitted -> accepted; a pod
  running -> running; Complete / Failed with the reason and the failing replica's exit code.
  **Cancel** deletes the Job with foreground propagation. **Logs** are read from the pods.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    InsufficientCapacityError,
    JobReport,
    LogChunk,
    ReplicaReport,
    Submission,
    SubmissionRefusedError,
    SubmitOutcome,
)
from iris_airflow_provider.backends.kubernetes_capacity import (
    GPU_RESOURCE,
    KUEUE_ADMISSION_GATE,
    VARIANT_POD_LABEL,
    CapacityPolicy,
    ClusterCapacity,
    cluster_capacity,
)
from iris_airflow_provider.federation.availability import PeerBackend
from iris_airflow_provider.federation.bands import Band
from iris_airflow_provider.federation.constraints import normalize_advertised
from iris_airflow_provider.federation.model import JobSpec, file_bytes
from iris_airflow_provider.federation.states import JobState

if TYPE_CHECKING:
    from iris_airflow_provider.cluster.config import KubernetesBackendConfig

log = logging.getLogger(__name__)

LABEL_PREFIX = "iris.marin.community/"
JOB_KEY_LABEL = LABEL_PREFIX + "job-key"  # a digest of the job id: ids do not fit label values
NONCE_LABEL = LABEL_PREFIX + "nonce"
REQUESTER_LABEL = LABEL_PREFIX + "requester"
BAND_LABEL = LABEL_PREFIX + "band"
JOB_ID_ANNOTATION = LABEL_PREFIX + "job-id"
NONCE_ANNOTATION = LABEL_PREFIX + "nonce"
REQUESTER_ANNOTATION = LABEL_PREFIX + "requester"
SUBMITTED_AT_ANNOTATION = LABEL_PREFIX + "submitted-at-ms"
MANAGED_BY = {"app.kubernetes.io/managed-by": "iris-airflow-provider"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTAINER = "job"
WORKDIR = "/iris/workdir"
LIST_PAGE = 500
LOG_SKEW_MARGIN_S = 300  # reading logs "since" the last line seen: tolerate this much clock skew
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


class KubernetesUnavailableError(ConnectionError):
    """The API server could not be reached or refused for a reason a retry (or an admin) can fix.

    An ``OSError``: the agentless peer reports it as unavailable, and the tick retries with backoff.
    """


def job_name(job_id: str) -> str:
    """The Job's name: readable, at most 52 characters (pod hostnames add an index), unique by digest."""
    readable = _NOT_NAME.sub("-", job_id.lower()).strip("-")[:36].strip("-")
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return f"iris-{readable}-{digest}" if readable else f"iris-{digest}"


def job_key(job_id: str) -> str:
    return hashlib.sha1(job_id.encode()).hexdigest()


def label_value(value: str) -> str:
    """``value`` when it is a valid label value, else a digest of it."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return hashlib.sha1(value.encode()).hexdigest()


def files_object_name(name: str, nonce: str) -> str:
    """Per incarnation: a replaced Job's files may still be being garbage-collected."""
    return f"{name}-files-{hashlib.sha1(nonce.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where a job's pods may go: the variant they are counted as, and the node label values allowed."""

    variant: str | None = None
    label_key: str | None = None
    label_values: tuple[str, ...] = ()


class KubernetesBackend:
    kind = "kubernetes"

    def __init__(
        self,
        backend_id: str,
        *,
        conn_id: str = "kubernetes_default",
        namespace: str = "",
        queue_name: str = "",
        priority_classes: Mapping[Band, str] | None = None,
        class_bands: Mapping[str, Band] | None = None,
        variant: str | None = None,
        variant_label: str | None = None,
        variant_values: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, str]] = (),
        image: str = "",
        attributes: Mapping[str, Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
        files_in: str = "configmap",
        max_files_bytes: int = 1_000_000,
        ttl_seconds_after_finished: int | None = None,
        request_timeout_seconds: float = 20,
        clock: Callable[[], int] | None = None,
    ) -> None:
        from kubernetes.client import V1Toleration

        self.backend_id = backend_id
        self.conn_id = conn_id
        self._namespace = namespace
        self.queue_name = queue_name
        self.priority_classes = dict(priority_classes or {})
        self.tolerations = [{k: v for k, v in t.items() if v} for t in tolerations]
        self.policy = CapacityPolicy(
            resource=GPU_RESOURCE,
            variant=variant,
            variant_label=variant_label,
            variant_values=dict(variant_values or {}),
            tolerations=tuple(V1Toleration(**t) for t in self.tolerations),
            band_of_class={**(class_bands or {}), **{name: band for band, name in self.priority_classes.items()}},
        )
        self.image = image
        self.attributes = {k: list(v) for k, v in (attributes or {}).items()}
        self.env = dict(env or {})
        self.files_in = files_in
        self.max_files_bytes = max_files_bytes
        self.ttl_seconds_after_finished = ttl_seconds_after_finished
        self.request_timeout = request_timeout_seconds
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._hook: Any = None
        self._warned_classes: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: KubernetesBackendConfig) -> KubernetesBackend:
        return cls(
            config.id,
            conn_id=config.conn_id,
            namespace=config.namespace,
            queue_name=config.queue_name,
            priority_classes=config.band_classes(),
            class_bands=config.class_bands(),
            variant=config.variant,
            variant_label=config.variant_label,
            variant_values=config.variant_values,
            tolerations=[t.model_dump() for t in config.tolerations],
            image=config.image,
            attributes=config.attributes,
            env=config.env,
            files_in=config.files_in,
            max_files_bytes=config.max_files_bytes,
            ttl_seconds_after_finished=config.ttl_seconds_after_finished,
            request_timeout_seconds=config.request_timeout_seconds,
        )

    # Clients, through the cncf-kubernetes provider's hooks ---------------------------------------

    @property
    def hook(self) -> Any:
        if self._hook is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
            from kubernetes.client import Configuration

            # Our own configuration object: the hook would otherwise load the kubeconfig into the
            # process-wide default, which another backend (another cluster) may be using.
            self._hook = KubernetesHook(conn_id=self.conn_id, client_configuration=Configuration())
        return self._hook

    def async_hook(self) -> Any:
        """A fresh async hook: its client belongs to the event loop that uses it."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=self.conn_id)

    @property
    def namespace(self) -> str:
        if not self._namespace:
            with self._api("reading the connection"):
                self._namespace = self.hook.get_namespace() or "default"
        return self._namespace

    @contextlib.contextmanager
    def _api(self, doing: str) -> Iterator[None]:
        """Failures of the API become ``KubernetesUnavailableError``, naming what we were doing."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as error:
            raise KubernetesUnavailableError(f"backend {self.backend_id}: {doing}: {_api_message(error)}") from error
        except HTTPError as error:
            raise KubernetesUnavailableError(
                f"backend {self.backend_id}: {doing}: cannot reach the Kubernetes API: {error}"
            ) from error

    @contextlib.asynccontextmanager
    async def _aapi(self, doing: str) -> AsyncIterator[Any]:
        """An async API client from the async hook; failures as in ``_api``."""
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            async with self.async_hook().get_conn() as api:
                yield api
        except ApiException as error:
            raise KubernetesUnavailableError(f"backend {self.backend_id}: {doing}: {_api_message(error)}") from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubernetesUnavailableError(
                f"backend {self.backend_id}: {doing}: cannot reach the Kubernetes API: {error}"
            ) from error

    # Heartbeat ---------------------------------------------------------------------------------

    def capacity(self) -> ClusterCapacity:
        core = self.hook.core_v1_client
        with self._api("listing nodes and pods"):
            nodes = self._list_all(core.list_node)
            # Finished pods hold nothing; the function checks the phase again in any case.
            pods = self._list_all(
                core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
            )
        return cluster_capacity(nodes, pods, self.policy)

    def describe(self) -> PeerBackend:
        return self._described(self.capacity())

    def _described(self, capacity: ClusterCapacity) -> PeerBackend:
        unknown = frozenset(capacity.unknown_classes)
        if unknown and unknown != self._warned_classes:
            held = sorted(capacity.unknown_classes.items())
            shown = ", ".join(f"{name or '(none)'}: {amount}" for name, amount in held)
            log.warning(
                "Backend %s: GPUs held by pods of PriorityClasses mapped to no band (%s) are reported as held "
                "and not reclaimable (band PRIORITY_BAND_UNSPECIFIED); map them in other_priority_classes",
                self.backend_id,
                shown,
            )
        self._warned_classes = unknown
        availability = capacity.availability(self.clock())
        return PeerBackend(self.backend_id, normalize_advertised(self.advertised(capacity)), availability, self.kind)

    def advertised(self, capacity: ClusterCapacity | None = None) -> dict[str, list[str]]:
        variants = sorted(set(capacity.variants) if capacity else self.policy.configured_variants())
        advertised = {"device-type": ["gpu" if variants else "cpu"], **self.attributes}
        if variants:
            advertised["device-variant"] = variants
        return advertised

    def _list_all(self, call: Callable[..., Any], **kwargs: Any) -> list[Any]:
        items: list[Any] = []
        token = None
        while True:
            page = call(limit=LIST_PAGE, _continue=token, _request_timeout=self.request_timeout, **kwargs)
            items.extend(page.items or ())
            token = page.metadata._continue if page.metadata else None
            if not token:
                return items

    # Submit ------------------------------------------------------------------------------------

    def submit(self, submission: Submission) -> SubmitOutcome:
        placement: JobPlacement | None = None  # worked out (from the nodes) only when a Job is to be made
        name = job_name(submission.job_id)
        batch = self.hook.batch_v1_client
        from kubernetes.client.exceptions import ApiException

        with self._api(f"submitting job {submission.job_id}"):
            for _attempt in range(2):
                existing = self._read_job(name)
                if existing is not None:
                    outcome = self._settle_existing(existing, submission)
                    if outcome is not None:
                        return outcome
                if placement is None:
                    placement = self._placement(submission.spec)
                manifest = self.job_manifest(submission, placement)
                try:
                    created = batch.create_namespaced_job(
                        self.namespace, manifest, _request_timeout=self.request_timeout
                    )
                except ApiException as error:
                    if error.status == 409:
                        continue  # someone created it between our read and our create: look again
                    if error.status in (400, 422):
                        raise SubmissionRefusedError(
                            f"Kubernetes refused the Job for {submission.job_id}: {_api_message(error)}"
                        ) from error
                    raise
                self._ensure_files(created, submission)
                return SubmitOutcome(job_report(created, [], self.backend_id))
        raise KubernetesUnavailableError(
            f"backend {self.backend_id}: the Job {name} of {submission.job_id} keeps changing under us; will retry"
        )

    def _settle_existing(self, existing: Any, submission: Submission) -> SubmitOutcome | None:
        """A replay (same nonce), ``already exists`` (another live incarnation), or None once a
        finished incarnation is out of the way."""
        annotations = existing.metadata.annotations or {}
        if annotations.get(JOB_ID_ANNOTATION) != submission.job_id:
            raise AlreadyExistsError(
                f"Job {existing.metadata.name} in namespace {self.namespace} belongs to "
                f"{annotations.get(JOB_ID_ANNOTATION) or 'something else'}, not {submission.job_id}"
            )
        if annotations.get(NONCE_ANNOTATION) == submission.nonce:
            self._ensure_files(existing, submission)
            return SubmitOutcome(job_report(existing, self._pods(existing), self.backend_id), replay=True)
        if existing.metadata.deletion_timestamp is None and not _finished(existing):
            raise AlreadyExistsError(
                f"Job {submission.job_id} is still running here as another incarnation "
                f"(nonce {annotations.get(NONCE_ANNOTATION)}, Job {existing.metadata.name})"
            )
        # A finished (or dying) incarnation: remove it, unless it was replaced meanwhile (uid).
        self._delete_job(existing, "Background")
        return None

    def _placement(self, spec: JobSpec) -> JobPlacement:
        """Where the job's pods may run, or a refusal naming what this backend lacks."""
        if not (spec.image or self.image):
            raise SubmissionRefusedError(
                f"job {spec.job_id} names no image and backend {self.backend_id} has no default image"
            )
        total = sum(len(file_bytes(content)) for content in spec.files.values())
        if total > self.max_files_bytes:
            raise SubmissionRefusedError(
                f"job {spec.job_id} carries {total} bytes of workdir files; backend {self.backend_id} passes at most "
                f"{self.max_files_bytes} bytes in a {self.files_in} (max_files_bytes; Kubernetes allows 1 MiB): "
                "put larger inputs in an object store the cluster can read"
            )
        device = spec.resources.device
        if device.type == "tpu":
            raise SubmissionRefusedError(f"backend {self.backend_id} is a Kubernetes cluster with GPUs, not TPUs")
        if device.type == "cpu" or device.variant == "auto":
            return JobPlacement()
        with self._api("listing nodes"):
            nodes = self._list_all(self.hook.core_v1_client.list_node)
        capacity = cluster_capacity(nodes, [], self.policy)
        offered = capacity.variants.get(device.variant)
        if offered is None:
            raise SubmissionRefusedError(
                f"backend {self.backend_id} has no {device.variant} GPUs; "
                f"it has {', '.join(sorted(capacity.variants)) or 'none'}"
            )
        if offered.largest_node and device.count > offered.largest_node:
            raise InsufficientCapacityError(
                f"backend {self.backend_id}: a replica needs {device.count} {device.variant} GPUs, "
                f"but no node has more than {offered.largest_node}"
            )
        if self.policy.variant:
            return JobPlacement(device.variant)
        values = tuple(self.policy.label_values_of(device.variant, nodes))
        return JobPlacement(device.variant, self.policy.variant_label, values)

    def job_manifest(self, submission: Submission, placement: JobPlacement) -> dict[str, Any]:
        """The batch/v1 Job for one incarnation (a plain dict, as the API server receives it)."""
        spec = submission.spec
        name = job_name(submission.job_id)
        replicas = spec.resources.replicas
        labels = {
            **MANAGED_BY,
            JOB_KEY_LABEL: job_key(submission.job_id),
            NONCE_LABEL: label_value(submission.nonce),
            REQUESTER_LABEL: label_value(submission.requester),
            BAND_LABEL: spec.priority_band.name.lower(),
        }
        annotations = {
            JOB_ID_ANNOTATION: submission.job_id,
            NONCE_ANNOTATION: submission.nonce,
            REQUESTER_ANNOTATION: submission.requester,
            SUBMITTED_AT_ANNOTATION: str(submission.submitted_at_ms),
        }
        pod_labels = dict(labels)
        if placement.variant:
            pod_labels[VARIANT_POD_LABEL] = placement.variant
        job_labels = dict(labels)
        if self.queue_name:
            job_labels[QUEUE_LABEL] = self.queue_name
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": spec.image or self.image,
            "env": self._env(submission, placement),
            "resources": _resources(spec),
        }
        if spec.command:
            container["command"] = list(spec.command)
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        priority_class = self.priority_classes.get(spec.priority_band)
        if priority_class:
            pod_spec["priorityClassName"] = priority_class
        if self.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in self.tolerations]
        if placement.label_key and placement.label_values:
            expression = {"key": placement.label_key, "operator": "In", "values": list(placement.label_values)}
            pod_spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                    }
                }
            }
        if spec.files:
            # A writable workdir with each file mounted at its path (read-only) from the files object.
            files = files_object_name(name, submission.nonce)
            source = {"secret": {"secretName": files}} if self.files_in == "secret" else {"configMap": {"name": files}}
            pod_spec["volumes"] = [{"name": "workdir", "emptyDir": {}}, {"name": "files", **source}]
            container["workingDir"] = WORKDIR
            container["volumeMounts"] = [
                {"name": "workdir", "mountPath": WORKDIR},
                *(
                    {"name": "files", "mountPath": f"{WORKDIR}/{path}", "subPath": key, "readOnly": True}
                    for key, path in _file_keys(spec.files).items()
                ),
            ]
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimit": 0,
            # Kueue admits a suspended Job by unsuspending it; without Kueue it starts at once.
            "suspend": bool(self.queue_name),
            "template": {"metadata": {"labels": pod_labels, "annotations": dict(annotations)}, "spec": pod_spec},
        }
        if self.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = self.ttl_seconds_after_finished
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace, "labels": job_labels, "annotations": annotations},
            "spec": job_spec,
        }

    def _env(self, submission: Submission, placement: JobPlacement) -> list[dict[str, Any]]:
        spec = submission.spec
        values = dict(self.env)
        values.update(
            IRIS_JOB_ID=submission.job_id,
            IRIS_JOB_NONCE=submission.nonce,
            IRIS_NUM_REPLICAS=str(spec.resources.replicas),
            IRIS_BACKEND_ID=self.backend_id,
        )
        if placement.variant:
            values["IRIS_DEVICE_VARIANT"] = placement.variant
        values.update(spec.env)  # the job's own environment wins
        env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in values.items()]
        if "IRIS_REPLICA_INDEX" not in values:
            field_path = f"metadata.annotations['{COMPLETION_INDEX}']"
            env.append({"name": "IRIS_REPLICA_INDEX", "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
        return env

    def files_manifest(self, job: Any, submission: Submission) -> dict[str, Any]:
        """The ConfigMap (or Secret) carrying the workdir files, owned by the Job it belongs to."""
        data: dict[str, str] = {}
        binary: dict[str, str] = {}
        for key, path in _file_keys(submission.spec.files).items():
            content = submission.spec.files[path]
            raw = file_bytes(content)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                text = None
            if self.files_in == "secret" or text is None:
                import base64

                binary[key] = base64.b64encode(raw).decode()
            else:
                data[key] = text
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret" if self.files_in == "secret" else "ConfigMap",
            "metadata": {
                "name": files_object_name(job.metadata.name, submission.nonce),
                "namespace": self.namespace,
                "labels": dict(job.metadata.labels or {}),
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid}
                ],
            },
        }
        manifest["metadata"]["labels"].pop(QUEUE_LABEL, None)
        if self.files_in == "secret":
            manifest["data"] = binary
        else:
            if data:
                manifest["data"] = data
            if binary:
                manifest["binaryData"] = binary
        return manifest

    def _ensure_files(self, job: Any, submission: Submission) -> None:
        if not submission.spec.files:
            return
        from kubernetes.client.exceptions import ApiException

        core = self.hook.core_v1_client
        create = core.create_namespaced_secret if self.files_in == "secret" else core.create_namespaced_config_map
        try:
            create(self.namespace, self.files_manifest(job, submission), _request_timeout=self.request_timeout)
        except ApiException as error:
            if error.status == 409:
                return  # a replay after the first attempt got this far
            # Without its files the Job would wait forever: take it back, so a retry starts clean.
            with contextlib.suppress(ApiException):
                self._delete_job(job, "Background")
            if error.status in (400, 422):
                raise SubmissionRefusedError(
                    f"Kubernetes refused the files of {submission.job_id}: {_api_message(error)}"
                ) from error
            raise

    # Status, cancel ----------------------------------------------------------------------------

    def status(self, job_id: str) -> JobReport | None:
        with self._api(f"reading job {job_id}"):
            job = self._our_job(job_id)
            return None if job is None else job_report(job, self._pods(job), self.backend_id)

    def _our_job(self, job_id: str) -> Any:
        """The Job of ``job_id``, or None: none by that name, or one by that name that is not ours."""
        job = self._read_job(job_name(job_id))
        if job is None or (job.metadata.annotations or {}).get(JOB_ID_ANNOTATION) != job_id:
            return None
        return job

    def cancel(self, job_id: str) -> bool:
        with self._api(f"cancelling job {job_id}"):
            job = self._our_job(job_id)
            if job is None:
                return False
            if not _finished(job):  # a finished job keeps its Job: its status and logs stay readable
                self._delete_job(job, "Foreground")
            return True

    def _read_job(self, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.hook.batch_v1_client.read_namespaced_job(
                name, self.namespace, _request_timeout=self.request_timeout
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _delete_job(self, job: Any, propagation: str) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"propagationPolicy": propagation, "preconditions": {"uid": job.metadata.uid}}
        try:
            self.hook.batch_v1_client.delete_namespaced_job(
                job.metadata.name, self.namespace, body=body, _request_timeout=self.request_timeout
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or replaced (uid precondition)
                raise

    def _pods(self, job: Any) -> list[Any]:
        return self._list_all(
            self.hook.core_v1_client.list_namespaced_pod, namespace=self.namespace, label_selector=_pod_selector(job)
        )

    # Logs --------------------------------------------------------------------------------------

    def logs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk:
        from kubernetes.client.exceptions import ApiException

        with self._api(f"reading the output of job {job_id}"):
            job = self._our_job(job_id)
            if job is None:
                return LogChunk((), cursor)
            reader = _LogReader(cursor, max_lines, self.clock())
            for pod, since in reader.plan(self._pods(job)):
                try:
                    response = self.hook.core_v1_client.read_namespaced_pod_log(
                        pod.metadata.name,
                        self.namespace,
                        container=CONTAINER,
                        timestamps=True,
                        since_seconds=since,
                        _preload_content=False,
                        _request_timeout=self.request_timeout,
                    )
                except ApiException as error:
                    if error.status in (400, 404):  # not started yet, or gone
                        continue
                    raise
                if not reader.take(pod, response.data):
                    break
            return reader.chunk()

    # The same reads, for a trigger's event loop ------------------------------------------------

    async def adescribe(self) -> PeerBackend:
        from kubernetes_asyncio.client import CoreV1Api

        async with self._aapi("listing nodes and pods") as api:
            core = CoreV1Api(api)
            nodes = await self._alist_all(core.list_node)
            pods = await self._alist_all(
                core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
            )
        return self._described(cluster_capacity(nodes, pods, self.policy))

    async def astatus(self, job_id: str) -> JobReport | None:
        namespace = await self._anamespace()
        async with self._aapi(f"reading job {job_id}") as api:
            found = await self._ajob_and_pods(api, namespace, job_id)
        return job_report(found[0], found[1], self.backend_id) if found else None

    async def alogs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk:
        from kubernetes_asyncio.client import CoreV1Api
        from kubernetes_asyncio.client.exceptions import ApiException

        namespace = await self._anamespace()
        async with self._aapi(f"reading the output of job {job_id}") as api:
            found = await self._ajob_and_pods(api, namespace, job_id)
            if found is None:
                return LogChunk((), cursor)
            reader = _LogReader(cursor, max_lines, self.clock())
            for pod, since in reader.plan(found[1]):
                bound: dict[str, Any] = {"since_seconds": since} if since is not None else {}
                try:
                    # Raw bytes (``_preload_content=False``): a job's output need not be valid UTF-8.
                    response: Any = await CoreV1Api(api).read_namespaced_pod_log(
                        pod.metadata.name,
                        namespace,
                        container=CONTAINER,
                        timestamps=True,
                        _preload_content=False,
                        **bound,
                    )
                    data = await response.read()
                except ApiException as error:
                    if error.status in (400, 404):
                        continue
                    raise
                if not reader.take(pod, data):
                    break
        return reader.chunk()

    async def _ajob_and_pods(self, api: Any, namespace: str, job_id: str) -> tuple[Any, list[Any]] | None:
        from kubernetes_asyncio.client import BatchV1Api, CoreV1Api
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            job = await BatchV1Api(api).read_namespaced_job(job_name(job_id), namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        if (job.metadata.annotations or {}).get(JOB_ID_ANNOTATION) != job_id:
            return None
        pods = await self._alist_all(
            CoreV1Api(api).list_namespaced_pod, namespace=namespace, label_selector=_pod_selector(job)
        )
        return job, pods

    async def _anamespace(self) -> str:
        if not self._namespace:
            hook = self.async_hook()
            self._namespace = (await hook._get_field("namespace")) or "default"
        return self._namespace

    async def _alist_all(self, call: Callable[..., Any], **kwargs: Any) -> list[Any]:
        items: list[Any] = []
        token = None
        while True:
            page = await call(limit=LIST_PAGE, _continue=token, **kwargs)
            items.extend(page.items or ())
            token = page.metadata._continue if page.metadata else None
            if not token:
                return items


# Pure helpers: reports, resources, files, log cursors -------------------------------------------


def job_report(job: Any, pods: Sequence[Any], backend_id: str) -> JobReport:
    """The seed's view of one Job and its pods."""
    annotations = job.metadata.annotations or {}
    status = job.status
    conditions = {c.type: c for c in ((status.conditions if status else None) or ()) if c.status == "True"}
    replicas = int(job.spec.completions or job.spec.parallelism or 1)
    latest = _latest_pod_per_index(pods)
    codes = {index: _exit_code(pod) for index, pod in latest.items()}
    error = ""
    exit_code: int | None = None
    finished_at = None
    if "Complete" in conditions:
        state, exit_code = JobState.SUCCEEDED, 0
        finished_at = (status.completion_time if status else None) or conditions["Complete"].last_transition_time
    elif "Failed" in conditions:
        state = JobState.FAILED
        failed = conditions["Failed"]
        finished_at = failed.last_transition_time
        culprit = _first_failed(latest)
        parts = []
        if culprit is not None:
            index, pod = culprit
            exit_code = codes.get(index)
            reason = _terminated(pod).reason if _terminated(pod) is not None else None
            shown = f" ({reason})" if reason and reason not in ("Error", "Completed") else ""
            parts.append(f"Replica {index} exited with code {exit_code}{shown}")
        parts.append(f"Job failed: {failed.reason or 'Failed'}" + (f": {failed.message}" if failed.message else ""))
        error = "; ".join(parts)
    elif job.metadata.deletion_timestamp is not None:
        state, error = JobState.KILLED, "Cancelled: the Job is being deleted"
    elif job.spec.suspend or any(_gated(pod) for pod in pods):
        state = JobState.PENDING  # waiting for Kueue to admit it
    elif any((pod.status.phase if pod.status else None) in ("Running", "Succeeded", "Failed") for pod in pods):
        state = JobState.RUNNING
    else:
        state = JobState.ACCEPTED  # admitted; its pods are being created or scheduled
    reports = []
    for index in range(replicas):
        pod = latest.get(index)
        phase = (pod.status.phase if pod is not None and pod.status else None) or ""
        replica_state = {
            "Running": JobState.RUNNING,
            "Succeeded": JobState.SUCCEEDED,
            "Failed": JobState.FAILED,
        }.get(phase, state if pod is None or state.terminal else JobState.ACCEPTED)
        reports.append(ReplicaReport(index, replica_state, codes.get(index)))
    return JobReport(
        job_id=annotations.get(JOB_ID_ANNOTATION, ""),
        nonce=annotations.get(NONCE_ANNOTATION, ""),
        state=state,
        backend_id=backend_id,
        error=error,
        exit_code=exit_code,
        started_at_ms=_ms(status.start_time if status else None),
        finished_at_ms=_ms(finished_at),
        replicas=tuple(reports),
    )


def _pod_selector(job: Any) -> str:
    """This incarnation's pods (a replaced incarnation's may still be terminating)."""
    labels = job.metadata.labels or {}
    return f"{JOB_KEY_LABEL}={labels.get(JOB_KEY_LABEL, '')},{NONCE_LABEL}={labels.get(NONCE_LABEL, '')}"


def _finished(job: Any) -> bool:
    conditions = (job.status.conditions if job.status else None) or ()
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


def _gated(pod: Any) -> bool:
    return any(gate.name == KUEUE_ADMISSION_GATE for gate in (pod.spec.scheduling_gates or ()))


def _pod_index(pod: Any) -> int:
    annotations = pod.metadata.annotations or {}
    labels = pod.metadata.labels or {}
    raw = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX) or "0"
    try:
        return int(raw)
    except ValueError:
        return 0


def _latest_pod_per_index(pods: Sequence[Any]) -> dict[int, Any]:
    latest: dict[int, Any] = {}
    for pod in sorted(pods, key=lambda p: _ms(p.metadata.creation_timestamp) or 0):
        latest[_pod_index(pod)] = pod
    return latest


def _terminated(pod: Any) -> Any:
    for status in (pod.status.container_statuses if pod.status else None) or ():
        if status.name == CONTAINER and status.state is not None and status.state.terminated is not None:
            return status.state.terminated
    return None


def _exit_code(pod: Any) -> int | None:
    terminated = _terminated(pod)
    return int(terminated.exit_code) if terminated is not None else None


def _first_failed(latest: Mapping[int, Any]) -> tuple[int, Any] | None:
    """The replica that failed first (the others may have been stopped because of it)."""
    failed = [
        (index, pod)
        for index, pod in latest.items()
        if (pod.status.phase if pod.status else None) == "Failed" or (_exit_code(pod) or 0) != 0
    ]
    if not failed:
        return None
    return min(failed, key=lambda item: (_ms(getattr(_terminated(item[1]), "finished_at", None)) or 0, item[0]))


def _ms(value: datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def _resources(spec: JobSpec) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    device = spec.resources.device
    if device.type == "gpu":
        # Extended resources cannot be overcommitted: the request must equal the limit.
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(device.count)
    if spec.resources.cpu:
        requests["cpu"] = f"{round(spec.resources.cpu * 1000)}m"
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = str(spec.resources.memory)
    resources: dict[str, dict[str, str]] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def _file_keys(files: Mapping[str, str]) -> dict[str, str]:
    """A ConfigMap key for each workdir path (keys allow letters, digits, '-', '_' and '.' only)."""
    keys = {}
    for index, path in enumerate(sorted(files)):
        readable = re.sub(r"[^-._a-zA-Z0-9]+", "_", path)[-200:].lstrip(".") or "file"
        keys[f"f{index:03d}-{readable}"] = path
    return keys


def _api_message(error: Any) -> str:
    """The API server's own words (its Status message), with the HTTP status."""
    status = getattr(error, "status", None)
    reason = getattr(error, "reason", "") or ""
    message = ""
    body = getattr(error, "body", None)
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:500]
    if status in (401, 403):
        message += " (check the connection's credentials and the RBAC this backend needs; see the README)"
    return f"HTTP {status} {reason}: {message}".strip().rstrip(":")


def _parse_timestamp(raw: str) -> int | None:
    """RFC 3339 with up to nanoseconds (as the kubelet writes them) -> nanoseconds since the epoch."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", raw)
    if match is None:
        return None
    zone = "+00:00" if match[3] == "Z" else match[3]
    seconds = int(datetime.fromisoformat(match[1] + zone).timestamp())
    return seconds * 1_000_000_000 + int((match[2] or "0").ljust(9, "0"))


class _LogReader:
    """New lines of a job's pods since the cursor: per pod, the last timestamp seen and how many
    lines carried it (the API has no offsets; timestamps with a count make re-reads exact)."""

    def __init__(self, cursor: str, max_lines: int, now_ms: int) -> None:
        self.positions: dict[str, list[int]] = json.loads(cursor) if cursor else {}
        self.max_lines = max_lines
        self.now_ms = now_ms
        self.lines: list[str] = []
        self.truncated = False

    def plan(self, pods: Sequence[Any]) -> list[tuple[Any, int | None]]:
        """The pods to read, in replica order, each with a ``since_seconds`` bound (None: all)."""
        ordered = sorted(pods, key=lambda p: (_pod_index(p), _ms(p.metadata.creation_timestamp) or 0))
        plan = []
        for pod in ordered:
            if (pod.status.phase if pod.status else None) not in ("Running", "Succeeded", "Failed"):
                continue
            position = self.positions.get(pod.metadata.name)
            since = None
            if position:
                since = max(1, (self.now_ms * 1_000_000 - position[0]) // 1_000_000_000 + LOG_SKEW_MARGIN_S)
            plan.append((pod, since))
        return plan

    def take(self, pod: Any, data: bytes | str) -> bool:
        """Add the pod's new lines; False once ``max_lines`` is reached."""
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        name = pod.metadata.name
        last, seen_at_last = self.positions.get(name, [0, 0])
        index = _pod_index(pod)
        same = 0  # lines carrying the current timestamp so far in this read
        current = None
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")
            when = _parse_timestamp(stamp)
            if when is None:
                continue
            same = same + 1 if when == current else 1
            current = when
            if when < last or (when == last and same <= seen_at_last):
                continue
            if len(self.lines) >= self.max_lines:
                self.truncated = True
                return False
            self.lines.append(f"[replica {index}] {line}")
            last, seen_at_last = when, same
            self.positions[name] = [last, seen_at_last]
        return True

    def chunk(self) -> LogChunk:
        return LogChunk(tuple(self.lines), json.dumps(self.positions, sort_keys=True), self.truncated)


__all__ = ["KubernetesBackend", "KubernetesUnavailableError", "job_name", "job_report"]

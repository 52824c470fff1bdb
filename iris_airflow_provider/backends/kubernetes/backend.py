"""The ``kubernetes`` backend: one batch/v1 Job per federated job, on a cluster run by Kueue.

Reached through an Airflow connection of type ``kubernetes`` (the cncf-kubernetes provider's
``KubernetesHook``; see ``api.py``).

- **Capacity** (the heartbeat) comes from nodes and pods, through the pure
  :func:`~iris_airflow_provider.backends.kubernetes.capacity.cluster_capacity`.
- **A job** is an Indexed Job built by ``manifests.py``; workdir files travel in a ConfigMap (or
  Secret) owned by the Job; a job whose files do not fit is refused. A job of several replicas gets
  a headless Service owned by the Job, naming its pods for the rendezvous (``manifests.py``).
- **TPUs** (GKE): a node offering ``google.com/tpu`` counts for the slice its GKE labels name; a
  job of a concrete TPU variant runs as one pod per host of its slice on such nodes
  (``manifests.py``); one slice per job (several multi-host slices need the multislice
  environment, which the backend does not set up) and no ``auto``.
- **A job's token** for the job API is a Secret of the incarnation's, owned by the Job and mounted
  as ``$IRIS_JOB_TOKEN_FILE``, never a value in the Job; the tick renews those half spent
  (``job_tokens_due``, ``write_job_token``; ``job_token.py``).
- **Submitting** checks first what the backend can take and where the pods may go
  (``admission.py``), then makes the Job, idempotently by nonce (``submission.py``).
- **Status** is translated by ``status.py``; a complete Job's result is read from replica 0's log
  (``results.py``). **Cancel** deletes the Job with foreground
  propagation. **Logs** are read from the pods, with the cursor of ``logs.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from iris_airflow_provider.backends.base import (
    DEFAULT_COORDINATOR_PORT,
    JobReport,
    LogChunk,
    ServedPort,
    Submission,
    SubmitOutcome,
    advertised_attributes,
    now_ms,
)
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.backends.kubernetes.admission import Admission
from iris_airflow_provider.backends.kubernetes.api import (
    KubeApi,
    KubernetesUnavailableError,
)
from iris_airflow_provider.backends.kubernetes.capacity import (
    GPU_RESOURCE,
    CapacityPolicy,
    ClusterCapacity,
    cluster_capacity,
)
from iris_airflow_provider.backends.kubernetes.gcs_bundles import DEFAULT_FETCH_IMAGE, GcsBundleStore
from iris_airflow_provider.backends.kubernetes.job_token import token_data, token_expiry, token_secret_name
from iris_airflow_provider.backends.kubernetes.logs import LOG_SKEW_MARGIN_S, LogReader
from iris_airflow_provider.backends.kubernetes.manifests import SERVING_PORT_BASE, JobTemplate
from iris_airflow_provider.backends.kubernetes.names import (
    CONTAINER,
    JOB_ID_ANNOTATION,
    JOB_KEY_LABEL,
    NONCE_ANNOTATION,
    job_key,
    job_name,
    pod_selector,
)
from iris_airflow_provider.backends.kubernetes.pod_template import checked_pod_template
from iris_airflow_provider.backends.kubernetes.results import extract_result
from iris_airflow_provider.backends.kubernetes.status import finished, job_report, latest_pod_per_index, ms, terminated
from iris_airflow_provider.backends.kubernetes.submission import JobCreation
from iris_airflow_provider.core.availability import Availability, PeerBackend, settled
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.job_result import ResultError
from iris_airflow_provider.core.serving import port_env_name
from iris_airflow_provider.core.states import JobState

if TYPE_CHECKING:
    from iris_airflow_provider.backends.kubernetes.config import GKECluster, KubernetesBackendConfig

log = logging.getLogger(__name__)

RESULTS_REMEMBERED = 256


class KubernetesBackend:
    kind = "kubernetes"

    def __init__(
        self,
        backend_id: str,
        *,
        conn_id: str = "kubernetes_default",
        gke: GKECluster | None = None,
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
        coordinator_port: int = DEFAULT_COORDINATOR_PORT,
        serving_port_base: int = SERVING_PORT_BASE,
        request_timeout_seconds: float = 20,
        pod_template: Mapping[str, Any] | None = None,
        bundle_store: str | None = None,
        bundle_gcp_conn_id: str = "google_cloud_default",
        bundle_fetch_image: str = DEFAULT_FETCH_IMAGE,
        bundles: BundleStore | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        from kubernetes.client import V1Toleration

        self.backend_id = backend_id
        self.api = KubeApi(backend_id, conn_id, namespace, request_timeout_seconds, gke=gke)
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
        # Where workdir bundles go for the pods to fetch (gcs_bundles.py), from this cluster's own
        # store (where the operator packed them, or a parent uploaded them); without both, none.
        self.bundle_store = GcsBundleStore(bundle_store, bundle_gcp_conn_id) if bundle_store else None
        self.bundles = bundles
        self.template = JobTemplate(
            backend_id=backend_id,
            queue_name=queue_name,
            priority_classes=self.priority_classes,
            tolerations=tuple(self.tolerations),
            image=image,
            env=self.env,
            files_in=files_in,
            ttl_seconds_after_finished=ttl_seconds_after_finished,
            coordinator_port=coordinator_port,
            serving_port_base=serving_port_base,
            pod_template=checked_pod_template(pod_template) if pod_template is not None else None,
            bundle_store=self.bundle_store,
            bundle_fetch_image=bundle_fetch_image,
        )
        self.clock = clock or now_ms
        self._warned_classes: frozenset[str] = frozenset()
        self._last_observation: Availability | None = None
        # Results read from finished pods' logs, by pod uid (a finished pod's log does not change).
        self._results: dict[str, str | ResultError | None] = {}

    @property
    def max_bundle_bytes(self) -> int:
        """The largest workdir bundle this backend runs: 0 without a bundle store."""
        if self.bundle_store is None or self.bundles is None:
            return 0
        return self.bundles.max_bundle_bytes

    def _admission(self) -> Admission:
        return Admission(
            self.backend_id, self.image, self.files_in, self.max_files_bytes, self.max_bundle_bytes, self.policy
        )

    @classmethod
    def from_config(cls, config: KubernetesBackendConfig, bundles: BundleStore | None = None) -> KubernetesBackend:
        # The config's fields are the constructor's keywords, but for the bands (parsed here) and
        # the tolerations (plain mappings for the client's model).
        settings = config.model_dump(
            exclude={"id", "kind", "gke", "priority_classes", "other_priority_classes", "pod_template_file"}
        )
        settings["gke"] = config.gke
        settings["pod_template"] = config.template()
        settings["tolerations"] = [t.model_dump() for t in config.tolerations]
        return cls(
            config.id,
            priority_classes=config.band_classes(),
            class_bands=config.class_bands(),
            bundles=bundles,
            **settings,
        )

    # Heartbeat ---------------------------------------------------------------------------------

    def capacity(self) -> ClusterCapacity:
        nodes, pods = self.api.nodes_and_active_pods()
        return cluster_capacity(nodes, pods, self.policy)

    def describe(self) -> PeerBackend:
        capacity = self.capacity()
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
        # An unchanged report keeps its epoch (``settled``). Remembered by this object, so per
        # process: a process that has not reported yet starts a new observation.
        availability = self._last_observation = settled(self._last_observation, capacity.availability(self.clock()))
        return PeerBackend(self.backend_id, normalize_advertised(self.advertised(capacity)), availability, self.kind)

    def advertised(self, capacity: ClusterCapacity | None = None) -> dict[str, list[str]]:
        variants = set(capacity.variants) if capacity else self.policy.configured_variants()
        tpus = capacity.tpu_variants if capacity else frozenset()
        kinds = [kind for kind, has in (("gpu", variants - tpus), ("tpu", tpus)) if has] or ["cpu"]
        advertised = advertised_attributes(kinds[0], variants, self.attributes)
        advertised["device-type"] = kinds
        return advertised

    # Submit (submission.py) --------------------------------------------------------------------

    def submit(self, submission: Submission) -> SubmitOutcome:
        return JobCreation(self.api, self.template, self._admission(), self.bundle_store, self.bundles).submit(
            submission
        )

    # Job tokens (job_token.py) -----------------------------------------------------------------

    def job_tokens_due(self, live: Iterable[tuple[str, str]], due: Callable[[int], bool]) -> set[tuple[str, str]]:
        """Which of the ``live`` incarnations (job id, nonce) hold a token here that is ``due`` for
        renewal (or unreadable), from one listing of the token Secrets; one not created yet, or gone,
        is not."""
        wanted = {token_secret_name(job_name(job_id), nonce): (job_id, nonce) for job_id, nonce in live}
        if not wanted:
            return set()
        with self.api.guard("listing job token Secrets"):
            secrets = self.api.token_secrets()
        found: set[tuple[str, str]] = set()
        for secret in secrets:
            incarnation = wanted.get(secret.metadata.name)
            if incarnation is not None and secret.metadata.deletion_timestamp is None:
                expires = token_expiry(secret.data)
                if expires is None or due(expires):
                    found.add(incarnation)
        return found

    def write_job_token(self, job_id: str, nonce: str, token: str) -> bool:
        """Put ``token`` in incarnation ``nonce``'s Secret, which its pods read as a file (renewed by
        the kubelet); False when that incarnation has no Secret here (not created yet, or gone)."""
        with self.api.guard(f"renewing the job token of {job_id}"):
            return self.api.patch_secret_data(token_secret_name(job_name(job_id), nonce), token_data(token))

    # Status, cancel, logs ----------------------------------------------------------------------

    def status(self, job_id: str) -> JobReport | None:
        with self.api.guard(f"reading job {job_id}"):
            job = self._our_job(job_id)
            if job is None:
                return None
            pods = self._pods(job)
            report = job_report(job, pods, self.backend_id)
            return self._with_result(report, pods) if report.state is JobState.SUCCEEDED else report

    def _with_result(self, report: JobReport, pods: Sequence[Any]) -> JobReport:
        """A complete Job's report with what replica 0 handed back (``results.py``): read from the end
        of its log, once per pod in this process; a result that cannot be handed back fails the job."""
        pod = latest_pod_per_index(pods).get(0)
        ended = terminated(pod) if pod is not None else None
        if pod is None or ended is None:
            return report
        uid = pod.metadata.uid
        if uid not in self._results:
            # Only the end of the log: the frame follows the job's last line (the node's clock on both).
            since = max(1, (self.clock() - (ms(ended.finished_at) or 0)) // 1000 + LOG_SKEW_MARGIN_S)
            data = self.api.pod_log(pod, CONTAINER, since)
            if data is None:
                return report  # the pod's log is gone: nothing to hand back
            text = data.decode(errors="replace") if isinstance(data, bytes) else data
            lines = [raw.partition(" ")[2] for raw in text.splitlines()]
            try:
                self._results[uid] = extract_result(lines)
            except ResultError as problem:
                self._results[uid] = problem
            while len(self._results) > RESULTS_REMEMBERED:
                self._results.pop(next(iter(self._results)))
        found = self._results[uid]
        if isinstance(found, ResultError):
            return replace(report, state=JobState.FAILED, error=str(found))
        return replace(report, result=found)

    def cancel(self, job_id: str) -> bool:
        with self.api.guard(f"cancelling job {job_id}"):
            job = self._our_job(job_id)
            if job is None:
                return False
            if not finished(job):  # a finished job keeps its Job: its status and logs stay readable
                self.api.delete_job(job, "Foreground")
            return True

    def logs(self, job_id: str, cursor: str = "", max_lines: int = 1000) -> LogChunk:
        with self.api.guard(f"reading the output of job {job_id}"):
            job = self._our_job(job_id)
            if job is None:
                return LogChunk((), cursor)
            reader = LogReader(cursor, max_lines, self.clock())
            for pod, since in reader.plan(self._pods(job)):
                data = self.api.pod_log(pod, CONTAINER, since)
                if data is None:
                    continue
                if not reader.take(pod, data):
                    break
            return reader.chunk()

    def served_port(self, job_id: str, port_name: str) -> ServedPort | None:
        """Replica 0's pod IP and the container port its env gives ``port_name`` (``IRIS_PORT_<NAME>``),
        while that pod runs: the api-server must reach pod IPs (it runs in the cluster, or routes to
        its pod network)."""
        with self.api.guard(f"finding where job {job_id} serves {port_name}"):
            job = self._our_job(job_id)
            if job is None or finished(job):
                return None
            pod = latest_pod_per_index(self._pods(job)).get(0)
            if pod is None or pod.status is None or pod.status.phase != "Running" or not pod.status.pod_ip:
                return None
            wanted = port_env_name(port_name)
            for container in pod.spec.containers or ():
                for variable in container.env or ():
                    if container.name == CONTAINER and variable.name == wanted and (variable.value or "").isdigit():
                        nonce = (job.metadata.annotations or {}).get(NONCE_ANNOTATION, "")
                        return ServedPort(pod.status.pod_ip, int(variable.value), nonce)
        return None

    def _our_job(self, job_id: str) -> Any:
        """The Job of ``job_id``, or None: none by that name, or one by that name that is not ours."""
        job = self.api.read_job(job_name(job_id))
        if job is None or (job.metadata.annotations or {}).get(JOB_ID_ANNOTATION) != job_id:
            return None
        return job

    def _pods(self, job: Any) -> list[Any]:
        return self.api.pods(pod_selector(job))


__all__ = [
    "JOB_KEY_LABEL",
    "NONCE_ANNOTATION",
    "KubernetesBackend",
    "KubernetesUnavailableError",
    "job_key",
    "job_name",
    "job_report",
]

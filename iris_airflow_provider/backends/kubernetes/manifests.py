"""The objects the ``kubernetes`` backend creates, as the API server receives them (plain dicts).

- **The Job** of one incarnation: an Indexed Job (``completions = parallelism = replicas``,
  ``backoffLimit: 0``: retries are the federation's, as new incarnations), named after the job id
  and labelled with a digest of it, the nonce, the requesting cluster and the band (``names.py``),
  carrying the Kueue ``queue-name`` label (created suspended: Kueue unsuspends it on
  admission) and the band's PriorityClass. GPUs are requested as ``nvidia.com/gpu`` on nodes of
  the job's variant.
- **A TPU job** runs one pod per host of its slice (``core/tpu.py``): ``completions = parallelism
  = replicas x hosts``, each pod requesting the host's chips as ``google.com/tpu``, on nodes
  selected by GKE's ``gke-tpu-accelerator`` and ``gke-tpu-topology`` labels (tolerating GKE's
  ``google.com/tpu`` taint), and told ``TPU_WORKER_ID`` (its host index, the completion index) and
  ``TPU_WORKER_HOSTNAMES`` (its slice's hosts, by their stable names under the rendezvous
  Service). Kueue admits the Job as one workload: every host together, or none.
- **Its files**: a ConfigMap (or Secret) owned by the Job, mounted file by file into a writable
  ``/iris/workdir``.
- **Its job token** (where the cluster issues them): a Secret owned by the Job, mounted as a file
  the tick renews (``job_token.py``), never a value of the Job's environment.
- **Its rendezvous** (more than one pod): a headless Service owned by the Job, selecting its pods,
  named by the pods' ``subdomain``: each pod then resolves as ``<job name>-<index>.<service>``
  (an Indexed Job's pods are named hosts), and every replica is told replica 0's
  (``rendezvous_env``), with its own rank from the completion index.
- **Its result**: an emptyDir at ``/iris/result`` for ``$IRIS_RESULT``, and the command wrapped so
  that the result reaches the log (``results.py``).

Pure: no API calls, no clock.
"""

from __future__ import annotations

import base64
import importlib.resources
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from iris_airflow_provider.backends.base import (
    DEFAULT_COORDINATOR_PORT,
    JOB_TOKEN_ENV,
    RANK_ENV,
    Submission,
    job_identity_env,
    rendezvous_env,
)
from iris_airflow_provider.backends.kubernetes.capacity import GPU_RESOURCE, VARIANT_POD_LABEL
from iris_airflow_provider.backends.kubernetes.gcs_bundles import DEFAULT_FETCH_IMAGE, GcsBundleStore
from iris_airflow_provider.backends.kubernetes.job_token import (
    token_env,
    token_secret_manifest,
    token_secret_name,
    token_volume,
)
from iris_airflow_provider.backends.kubernetes.names import (
    BAND_LABEL,
    BUNDLE_CONTAINER,
    COMPLETION_INDEX,
    CONTAINER,
    JOB_ID_ANNOTATION,
    JOB_KEY_LABEL,
    MANAGED_BY,
    NONCE_ANNOTATION,
    NONCE_LABEL,
    QUEUE_LABEL,
    REQUESTER_ANNOTATION,
    REQUESTER_LABEL,
    SUBMITTED_AT_ANNOTATION,
    coordinator_host,
    files_object_name,
    job_key,
    job_name,
    label_value,
    pod_hostname,
    rendezvous_service_name,
)
from iris_airflow_provider.backends.kubernetes.pod_template import merged_pod_template
from iris_airflow_provider.backends.kubernetes.results import RESULT_DIR, RESULT_PATH, RESULT_VOLUME, wrapped_command
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.job_files import file_bytes
from iris_airflow_provider.core.job_result import RESULT_ENV
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.serving import port_env
from iris_airflow_provider.core.tpu import TPU_RESOURCE, TpuSlice, tpu_slice

WORKDIR = "/iris/workdir"
# The init container's program: bundle_fetch.py's own source (it imports nothing of the package).
FETCH_PROGRAM = importlib.resources.files(__package__).joinpath("bundle_fetch.py").read_text()


SERVING_PORT_BASE = 8000


def serving_ports(spec: JobSpec, base: int = SERVING_PORT_BASE) -> list[int]:
    """The container port of each of the job's named ports, in order: the pod has its own network,
    so fixed numbers from ``base`` (the backend's ``serving_port_base``) never collide (the config
    keeps them clear of the coordinator's)."""
    return [base + index for index in range(len(spec.ports))]


def job_slice(spec: JobSpec) -> TpuSlice | None:
    """The TPU slice each replica of ``spec`` is, if it names one."""
    device = spec.resources.device
    return tpu_slice(device.variant) if device.type == "tpu" and device.variant != "auto" else None


def pod_count(spec: JobSpec) -> int:
    """The Job's pods: one per replica, or per host of each replica's TPU slice."""
    return spec.resources.replicas * spec.resources.hosts_per_replica


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where a job's pods may go: the variant they are counted as, and the node label values allowed."""

    variant: str | None = None
    label_key: str | None = None
    label_values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """What a backend's configuration adds to every Job it creates."""

    backend_id: str
    queue_name: str = ""
    priority_classes: Mapping[Band, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = ()
    image: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    files_in: str = "configmap"  # or "secret"
    ttl_seconds_after_finished: int | None = None
    coordinator_port: int = DEFAULT_COORDINATOR_PORT  # where replica 0 listens (MASTER_PORT)
    serving_port_base: int = SERVING_PORT_BASE  # the containerPort of a job's first named port
    pod_template: Mapping[str, Any] | None = None  # the peer's additions (pod_template.py)
    bundle_store: GcsBundleStore | None = None  # where the pods fetch workdir bundles from (gcs_bundles.py)
    bundle_fetch_image: str = DEFAULT_FETCH_IMAGE

    def job_manifest(self, submission: Submission, placement: JobPlacement, namespace: str) -> dict[str, Any]:
        """The batch/v1 Job for one incarnation."""
        spec = submission.spec
        name = job_name(submission.job_id)
        pods = pod_count(spec)
        tpu = job_slice(spec)
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
            "env": self.environment(submission, placement),
            "resources": resources(spec),
        }
        if spec.command:
            container["command"] = wrapped_command(spec.command)
        if spec.ports:
            numbers = serving_ports(spec, self.serving_port_base)
            container["ports"] = [{"containerPort": number, "protocol": "TCP"} for number in numbers]
        # Where the job writes its result ($IRIS_RESULT): writable whatever the image.
        volumes: list[dict[str, Any]] = [{"name": RESULT_VOLUME, "emptyDir": {}}]
        container["volumeMounts"] = [{"name": RESULT_VOLUME, "mountPath": RESULT_DIR}]
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
        if pods > 1:  # stable per-pod hostnames, through the headless Service of that name
            pod_spec["subdomain"] = rendezvous_service_name(name, submission.nonce)
        priority_class = self.priority_classes.get(spec.priority_band)
        if priority_class:
            pod_spec["priorityClassName"] = priority_class
        tolerations = [dict(t) for t in self.tolerations]
        if tpu is not None:
            pod_spec["nodeSelector"] = tpu.node_labels
            tolerations.append({"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        if tolerations:
            pod_spec["tolerations"] = tolerations
        if placement.label_key and placement.label_values:
            expression = {"key": placement.label_key, "operator": "In", "values": list(placement.label_values)}
            pod_spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                    }
                }
            }
        if spec.bundle is not None and self.bundle_store is not None:
            # A writable workdir the init container fills from the bundle store before the job starts.
            volumes.append({"name": "workdir", "emptyDir": {}})
            container["workingDir"] = WORKDIR
            container["volumeMounts"].append({"name": "workdir", "mountPath": WORKDIR})
            pod_spec["initContainers"] = [self.bundle_container(spec)]
        if JOB_TOKEN_ENV in submission.job_env:
            volume, mount = token_volume(token_secret_name(name, submission.nonce))
            volumes.append(volume)
            container["volumeMounts"].append(mount)
        if spec.files:
            # A writable workdir with each file mounted at its path (read-only) from the files object.
            files = files_object_name(name, submission.nonce)
            source = {"secret": {"secretName": files}} if self.files_in == "secret" else {"configMap": {"name": files}}
            volumes += [{"name": "workdir", "emptyDir": {}}, {"name": "files", **source}]
            container["workingDir"] = WORKDIR
            container["volumeMounts"] += [
                {"name": "workdir", "mountPath": WORKDIR},
                *(
                    {"name": "files", "mountPath": f"{WORKDIR}/{path}", "subPath": key, "readOnly": True}
                    for key, path in file_keys(spec.files).items()
                ),
            ]
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            # Kueue admits a suspended Job by unsuspending it; without Kueue it starts at once.
            "suspend": bool(self.queue_name),
            "template": merged_pod_template(
                {"metadata": {"labels": pod_labels, "annotations": dict(annotations)}, "spec": pod_spec},
                self.pod_template,
            ),
        }
        if self.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = self.ttl_seconds_after_finished
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": job_labels, "annotations": annotations},
            "spec": job_spec,
        }

    def bundle_container(self, spec: JobSpec) -> dict[str, Any]:
        """The init container that fetches the job's bundle into its workdir (``bundle_fetch.py``), with
        the pod's own credentials; the backend's env reaches it too (a proxy, an emulator host)."""
        assert spec.bundle is not None
        assert self.bundle_store is not None
        env = {
            **self.env,
            "IRIS_BUNDLE_URL": self.bundle_store.object_url(spec.bundle.digest),
            "IRIS_BUNDLE_DIGEST": spec.bundle.digest,
            "IRIS_BUNDLE_DIR": WORKDIR,
        }
        return {
            "name": BUNDLE_CONTAINER,
            "image": self.bundle_fetch_image,
            "command": ["python3", "-c", FETCH_PROGRAM],
            "env": [{"name": key, "value": value} for key, value in env.items()],
            "volumeMounts": [{"name": "workdir", "mountPath": WORKDIR}],
        }

    def environment(self, submission: Submission, placement: JobPlacement) -> list[dict[str, Any]]:
        """The container's env: the backend's defaults, the ``IRIS_*`` identity and the rendezvous,
        then the job's own (it wins; the job model refuses ``IRIS_*`` names); each replica's rank is
        its completion index, under every name of ``RANK_ENV`` the job did not set itself."""
        spec = submission.spec
        pods = pod_count(spec)
        name = job_name(submission.job_id)
        host = coordinator_host(name, submission.nonce, pods)
        values = dict(self.env)
        values.update(job_identity_env(spec.job_id, submission.nonce, pods, self.backend_id))
        values.update(rendezvous_env(host, self.coordinator_port, pods))
        values[RESULT_ENV] = RESULT_PATH
        ports = serving_ports(spec, self.serving_port_base)
        values.update(port_env(dict(zip((port.name for port in spec.ports), ports, strict=True))))
        if placement.variant:
            values["IRIS_DEVICE_VARIANT"] = placement.variant
        ranks = list(RANK_ENV)
        tpu = job_slice(spec)
        if tpu is not None and tpu.hosts > 1:
            # One slice per job (the backend refuses more): a host's index in it is its completion index.
            hosts = (pod_hostname(name, submission.nonce, index) for index in range(tpu.hosts))
            values["TPU_WORKER_HOSTNAMES"] = ",".join(hosts)
            ranks.append("TPU_WORKER_ID")
        values.update(spec.env)
        values.update(token_env(submission.job_env))  # IRIS_FEDERATION_URL and where its token is (job_token.py)
        env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in values.items()]
        field_path = f"metadata.annotations['{COMPLETION_INDEX}']"
        env += [
            {"name": rank, "valueFrom": {"fieldRef": {"fieldPath": field_path}}} for rank in ranks if rank not in values
        ]
        return env

    def files_manifest(self, job: Any, submission: Submission, namespace: str) -> dict[str, Any]:
        """The ConfigMap (or Secret) carrying the workdir files, owned by the Job it belongs to."""
        data: dict[str, str] = {}
        binary: dict[str, str] = {}
        for key, path in file_keys(submission.spec.files).items():
            raw = file_bytes(submission.spec.files[path])
            try:
                text: str | None = raw.decode()
            except UnicodeDecodeError:
                text = None
            if self.files_in == "secret" or text is None:
                binary[key] = base64.b64encode(raw).decode()
            else:
                data[key] = text
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret" if self.files_in == "secret" else "ConfigMap",
            "metadata": owned_metadata(job, files_object_name(job.metadata.name, submission.nonce), namespace),
        }
        if self.files_in == "secret":
            manifest["data"] = binary
        else:
            if data:
                manifest["data"] = data
            if binary:
                manifest["binaryData"] = binary
        return manifest

    def token_manifest(self, job: Any, submission: Submission, namespace: str) -> dict[str, Any]:
        """The Secret holding the incarnation's job token (``job_token.py``), owned by its Job."""
        name = token_secret_name(job.metadata.name, submission.nonce)
        return token_secret_manifest(owned_metadata(job, name, namespace), submission.job_env[JOB_TOKEN_ENV])

    def service_manifest(self, job: Any, submission: Submission, namespace: str) -> dict[str, Any]:
        """The headless Service of a multi-replica Job, owned by it: it selects this incarnation's pods
        (ready or not: replicas meet before any readiness), and gives each a DNS name under the
        ``subdomain`` the pods name it by."""
        labels = job.metadata.labels or {}
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": owned_metadata(job, rendezvous_service_name(job.metadata.name, submission.nonce), namespace),
            "spec": {
                "clusterIP": "None",
                "selector": {key: labels.get(key, "") for key in (JOB_KEY_LABEL, NONCE_LABEL)},
                "publishNotReadyAddresses": True,
                "ports": [{"name": "coordinator", "port": self.coordinator_port, "protocol": "TCP"}],
            },
        }


def owned_metadata(job: Any, name: str, namespace: str) -> dict[str, Any]:
    """The metadata of an object that lives and goes with ``job`` (garbage-collected with it)."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": {k: v for k, v in (job.metadata.labels or {}).items() if k != QUEUE_LABEL},
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid}
        ],
    }


def resources(spec: JobSpec) -> dict[str, dict[str, str]]:
    """A pod's container resources: its GPUs or its host's TPU chips (request = limit), CPU and memory."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    device = spec.resources.device
    # Extended resources cannot be overcommitted: the request must equal the limit.
    if device.type == "gpu":
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(device.count)
    elif device.type == "tpu":
        requests[TPU_RESOURCE] = limits[TPU_RESOURCE] = str(device.count)  # the chips of one host
    if spec.resources.cpu:
        requests["cpu"] = f"{round(spec.resources.cpu * 1000)}m"
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = str(spec.resources.memory)
    result: dict[str, dict[str, str]] = {}
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result


def file_keys(files: Mapping[str, str]) -> dict[str, str]:
    """A ConfigMap key for each workdir path (keys allow letters, digits, '-', '_' and '.' only)."""
    keys = {}
    for index, path in enumerate(sorted(files)):
        readable = re.sub(r"[^-._a-zA-Z0-9]+", "_", path)[-200:].lstrip(".") or "file"
        keys[f"f{index:03d}-{readable}"] = path
    return keys

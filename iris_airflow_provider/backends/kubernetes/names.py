"""How the ``kubernetes`` backend names, labels and annotates what it creates, and finds it again: the
Job's name derived from the job id (readable, unique by digest, short enough for pod hostnames), the
per-incarnation names of what the Job owns, the rendezvous hostnames, and the selector of an
incarnation's pods. Pure."""

from __future__ import annotations

import hashlib
import re
from typing import Any

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
BUNDLE_CONTAINER = "bundle"  # the init container that fetches a workdir bundle (bundle_fetch.py)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


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


def rendezvous_service_name(name: str, nonce: str) -> str:
    """The headless Service of a multi-replica Job (and its pods' ``subdomain``): a DNS label of at
    most 61 characters, per incarnation, as the files (a replaced Job's may still be going)."""
    return f"{name}-{hashlib.sha1(nonce.encode()).hexdigest()[:8]}"


def pod_hostname(name: str, nonce: str, index: int) -> str:
    """Pod ``index``'s stable hostname (``<job name>-<index>``, which the Job controller gives an
    Indexed Job's pod) under the Service, resolved through the namespace's search domain."""
    return f"{name}-{index}.{rendezvous_service_name(name, nonce)}"


def coordinator_host(name: str, nonce: str, replicas: int) -> str:
    """Where replica 0 is reached; a job of one pod is its own coordinator."""
    return pod_hostname(name, nonce, 0) if replicas > 1 else "127.0.0.1"


def pod_selector(job: Any) -> str:
    """This incarnation's pods (a replaced incarnation's may still be terminating)."""
    labels = job.metadata.labels or {}
    return f"{JOB_KEY_LABEL}={labels.get(JOB_KEY_LABEL, '')},{NONCE_LABEL}={labels.get(NONCE_LABEL, '')}"

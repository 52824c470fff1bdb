"""Making a job's Job on a Kubernetes backend, idempotently by nonce: the Job's name is derived from
the job id, so the API server itself makes two creates of one job collide; the same nonce is a replay,
another live incarnation is ``already exists``, a finished one is replaced. What the Job needs beside it
(its files, its job token, the Service its replicas meet through) is made after it, owned by it, and a
Job that cannot have them is taken back, so nothing is left half-made."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iris_airflow_provider.backends.base import (
    JOB_TOKEN_ENV,
    AlreadyExistsError,
    Submission,
    SubmissionRefusedError,
    SubmitOutcome,
)
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.backends.kubernetes.admission import Admission
from iris_airflow_provider.backends.kubernetes.api import KubeApi, KubernetesUnavailableError, api_message, error_status
from iris_airflow_provider.backends.kubernetes.gcs_bundles import GcsBundleStore
from iris_airflow_provider.backends.kubernetes.manifests import JobPlacement, JobTemplate, pod_count
from iris_airflow_provider.backends.kubernetes.names import JOB_ID_ANNOTATION, NONCE_ANNOTATION, job_name, pod_selector
from iris_airflow_provider.backends.kubernetes.status import finished, job_report
from iris_airflow_provider.core.model import JobSpec


@dataclass(frozen=True, slots=True)
class JobCreation:
    """One backend's way of making Jobs: its API, its Job template, what it admits, and where workdir
    bundles go for its pods to fetch (``bundle_store``, from this cluster's ``bundles``)."""

    api: KubeApi
    template: JobTemplate
    admission: Admission
    bundle_store: GcsBundleStore | None
    bundles: BundleStore | None

    @property
    def backend_id(self) -> str:
        return self.admission.backend_id

    def submit(self, submission: Submission) -> SubmitOutcome:
        placement: JobPlacement | None = None  # worked out (from the nodes) only when a Job is to be made
        name = job_name(submission.job_id)
        from kubernetes.client.exceptions import ApiException

        with self.api.guard(f"submitting job {submission.job_id}"):
            for _attempt in range(2):
                existing = self.api.read_job(name)
                if existing is not None:
                    outcome = self._settle_existing(existing, submission)
                    if outcome is not None:
                        return outcome
                if placement is None:
                    placement = self.admission.placement(submission.spec, self.api.nodes)
                    self._publish_bundle(submission.spec)  # before the Job: its pods fetch it at once
                manifest = self.template.job_manifest(submission, placement, self.api.namespace)
                try:
                    created = self.api.create_job(manifest)
                except ApiException as error:
                    if error_status(error) == 409:
                        continue  # someone created it between our read and our create: look again
                    if error_status(error) in (400, 422):
                        raise SubmissionRefusedError(
                            f"Kubernetes refused the Job for {submission.job_id}: {api_message(error)}"
                        ) from error
                    raise
                self._ensure_owned(created, submission)
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
                f"Job {existing.metadata.name} in namespace {self.api.namespace} belongs to "
                f"{annotations.get(JOB_ID_ANNOTATION) or 'something else'}, not {submission.job_id}"
            )
        if annotations.get(NONCE_ANNOTATION) == submission.nonce:
            self._ensure_owned(existing, submission)
            return SubmitOutcome(
                job_report(existing, self.api.pods(pod_selector(existing)), self.backend_id), replay=True
            )
        if existing.metadata.deletion_timestamp is None and not finished(existing):
            raise AlreadyExistsError(
                f"Job {submission.job_id} is still running here as another incarnation "
                f"(nonce {annotations.get(NONCE_ANNOTATION)}, Job {existing.metadata.name})"
            )
        # A finished (or dying) incarnation: remove it, unless it was replaced meanwhile (uid).
        self.api.delete_job(existing, "Background")
        return None

    def _publish_bundle(self, spec: JobSpec) -> None:
        """Puts the job's workdir bundle where its pods fetch it (once per digest)."""
        bundle = spec.bundle
        if bundle is None:
            return
        assert self.bundle_store is not None
        assert self.bundles is not None
        if not self.bundles.has(bundle):
            raise SubmissionRefusedError(f"job {spec.job_id}: its workdir bundle {bundle.digest} is not here")
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError

        try:
            self.bundle_store.put(bundle.digest, self.bundles.path(bundle))
        except (GoogleAPIError, GoogleAuthError, OSError) as error:
            raise KubernetesUnavailableError(
                f"backend {self.backend_id}: uploading the workdir bundle of {spec.job_id} to "
                f"{self.bundle_store.object_url(bundle.digest)}: {error}"
            ) from error

    def _ensure_owned(self, job: Any, submission: Submission) -> None:
        """Create what the Job needs beside it, owned by it (so it goes with it): its files, its job
        token, and for several replicas the headless Service they meet through. Made after the Job (the owner
        reference needs its uid); on a replay, whatever the first attempt did not get to."""
        from kubernetes.client.exceptions import ApiException

        namespace = self.api.namespace
        needed: list[tuple[str, Callable[[dict[str, Any]], None], dict[str, Any]]] = []
        if submission.spec.files:
            needed.append(("files", self.api.create_config, self.template.files_manifest(job, submission, namespace)))
        if JOB_TOKEN_ENV in submission.job_env:
            token = self.template.token_manifest(job, submission, namespace)
            needed.append(("job token Secret", self.api.create_config, token))
        if pod_count(submission.spec) > 1:
            service = self.template.service_manifest(job, submission, namespace)
            needed.append(("rendezvous Service", self.api.create_service, service))
        for what, create, manifest in needed:
            try:
                create(manifest)
            except ApiException as error:
                if error_status(error) == 409:
                    continue  # a replay after the first attempt got this far
                # Without its files or token the Job would wait forever, without its Service its
                # replicas would never meet: take it back, so a retry starts clean.
                with contextlib.suppress(ApiException):
                    self.api.delete_job(job, "Background")
                if error_status(error) in (400, 422):
                    raise SubmissionRefusedError(
                        f"Kubernetes refused the {what} of {submission.job_id}: {api_message(error)}"
                    ) from error
                raise

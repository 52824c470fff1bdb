"""The ``kubernetes`` backend's calls to the API server, through the cncf-kubernetes provider's hook
(or, for a cluster named by ``gke:``, the google provider's ``GKEKubernetesHook``, which serves the
same clients: ``gke.py``).

Every call takes the request timeout; every list is paged. Every call is retried as the provider
retries its own (``generic_api_retry``'s wait, which honours a 429's ``Retry-After``, and its
``[workers] api_retries`` attempts) when the server asks to back off (429) or fails transiently
(500, 502, 503, 504). Not on a 409, which ``generic_api_retry`` also retries: here it is an answer
(a Job created meanwhile, or replaced), handled at once; nor on a connection failure, which the
tick already retries with backoff. The hook's own calls are not used: ``get_job`` takes no request
timeout, ``create_job`` retries a 409 and logs the manifest as an exception, and the job status
helpers count a condition whose status is ``"False"`` as set.

``guard`` turns the API's failures into ``KubernetesUnavailableError`` (an ``OSError``: the
agentless peer reports it as unavailable, and the tick retries with backoff), naming what was
being done. The Kubernetes client is untyped: its objects are ``Any`` here and in the pure modules
that read them.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from iris_airflow_provider.backends.kubernetes.job_token import TOKEN_SECRET_LABEL

if TYPE_CHECKING:
    from iris_airflow_provider.backends.kubernetes.config import GKECluster

log = logging.getLogger(__name__)

LIST_PAGE = 500
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
LONGEST_RETRY_WAIT_S = 60.0  # a tick does not wait longer on one call, whatever Retry-After says


class KubernetesUnavailableError(ConnectionError):
    """The API server could not be reached or refused for a reason a retry (or an admin) can fix.

    An ``OSError``: the agentless peer reports it as unavailable, and the tick retries with backoff.
    """


def api_message(error: Any) -> str:
    """The API server's own words (its Status message), with the HTTP status."""
    status = getattr(error, "status", None)
    reason = getattr(error, "reason", "") or ""
    message = ""
    body = getattr(error, "body", None)
    if body:
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = str(body)[:500]
    if status in (401, 403):
        message += " (check the connection's credentials and the RBAC this backend needs; see the README)"
    return f"HTTP {status} {reason}: {message}".strip().rstrip(":")


def error_status(error: BaseException) -> int | None:
    """The HTTP status of an ``ApiException`` (None for anything else)."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def retried(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, retried by the cncf provider's policy on ``RETRIED_STATUSES``."""
    import tenacity
    from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import (
        API_RETRIES,
        WaitRetryAfterOrExponential,
    )
    from kubernetes.client.exceptions import ApiException

    provider_wait = WaitRetryAfterOrExponential()
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(API_RETRIES),
        wait=lambda state: min(provider_wait(state), LONGEST_RETRY_WAIT_S),
        retry=tenacity.retry_if_exception(
            lambda error: isinstance(error, ApiException) and error.status in RETRIED_STATUSES
        ),
        reraise=True,
        before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
    )
    return retrying(function, *args, **kwargs)


class KubeApi:
    """One backend's view of one cluster: its connection (a ``kubernetes`` connection, or a GKE
    cluster through a Google Cloud connection), namespace and the calls it makes."""

    def __init__(
        self,
        backend_id: str,
        conn_id: str,
        namespace: str = "",
        request_timeout: float = 20,
        gke: GKECluster | None = None,
    ) -> None:
        self.backend_id = backend_id
        self.conn_id = conn_id
        self.gke = gke
        self._namespace = namespace
        self.request_timeout = request_timeout
        self._hook: Any = None
        # Failures that mean "unreachable for now" besides the Kubernetes client's (``guard``).
        self._unavailable_errors: tuple[type[Exception], ...] = ()

    @property
    def hook(self) -> Any:
        if self._hook is None:
            from urllib3.util.retry import Retry

            # urllib3's default (3 retries) would also wait out a 429's or 503's Retry-After (up to
            # 6 hours, silently) under ``retried``: keep its connection retries, leave statuses to us.
            retries = Retry(3, respect_retry_after_header=False)
            self._hook = self._gke_hook(self.gke, retries) if self.gke else self._kubernetes_hook(retries)
        return self._hook

    def _kubernetes_hook(self, retries: Any) -> Any:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes.client import Configuration

        # Our own configuration object: the hook would otherwise load the kubeconfig into the
        # process-wide default, which another backend (another cluster) may be using.
        configuration = Configuration()
        configuration.retries = retries
        return KubernetesHook(conn_id=self.conn_id, client_configuration=configuration)

    def _gke_hook(self, cluster: GKECluster, retries: Any) -> Any:
        from iris_airflow_provider.backends.kubernetes.gke import GOOGLE_ERRORS, gke_kubernetes_hook

        self._unavailable_errors = GOOGLE_ERRORS  # a token refresh can fail on any later call too
        try:
            return gke_kubernetes_hook(cluster, retries)
        except GOOGLE_ERRORS as error:
            project = f"project {cluster.project_id}" if cluster.project_id else "the connection's project"
            raise KubernetesUnavailableError(
                f"backend {self.backend_id}: fetching GKE cluster {cluster.cluster_name} ({project}, location"
                f" {cluster.location}) with connection {cluster.gcp_conn_id}: {error}"
            ) from error

    @property
    def namespace(self) -> str:
        if not self._namespace and self.gke is not None:
            self._namespace = "default"  # a Google Cloud connection names no namespace
        if not self._namespace:
            with self.guard("reading the connection"):
                self._namespace = str(self.hook.get_namespace() or "default")
        return self._namespace

    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Failures of the API become ``KubernetesUnavailableError``, naming what we were doing."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as error:
            raise KubernetesUnavailableError(f"backend {self.backend_id}: {doing}: {api_message(error)}") from error
        except HTTPError as error:
            raise KubernetesUnavailableError(
                f"backend {self.backend_id}: {doing}: cannot reach the Kubernetes API: {error}"
            ) from error
        except self._unavailable_errors as error:
            raise KubernetesUnavailableError(f"backend {self.backend_id}: {doing}: {error}") from error

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call, with the request timeout, retried (``retried``)."""
        return retried(function, *args, _request_timeout=self.request_timeout, **kwargs)

    def list_all(self, call: Callable[..., Any], **kwargs: Any) -> list[Any]:
        items: list[Any] = []
        token = None
        while True:
            page = self.call(call, limit=LIST_PAGE, _continue=token, **kwargs)
            items.extend(page.items or ())
            token = page.metadata._continue if page.metadata else None
            if not token:
                return items

    # Nodes and pods (the heartbeat) -------------------------------------------------------------

    def nodes_and_active_pods(self) -> tuple[list[Any], list[Any]]:
        core = self.hook.core_v1_client
        with self.guard("listing nodes and pods"):
            nodes = self.list_all(core.list_node)
            # Finished pods hold nothing; the capacity function checks the phase again in any case.
            pods = self.list_all(
                core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
            )
        return nodes, pods

    def nodes(self) -> list[Any]:
        with self.guard("listing nodes"):
            return self.list_all(self.hook.core_v1_client.list_node)

    # Jobs, their files and pods (callers guard) -------------------------------------------------

    def read_job(self, name: str) -> Any:
        """The Job called ``name``, or None."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.call(self.hook.batch_v1_client.read_namespaced_job, name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_job(self, manifest: dict[str, Any]) -> Any:
        return self.call(self.hook.batch_v1_client.create_namespaced_job, self.namespace, manifest)

    def delete_job(self, job: Any, propagation: str) -> None:
        """Delete this Job (by uid: not one that replaced it); a Job already gone is fine."""
        from kubernetes.client.exceptions import ApiException

        body = {"propagationPolicy": propagation, "preconditions": {"uid": job.metadata.uid}}
        try:
            self.call(self.hook.batch_v1_client.delete_namespaced_job, job.metadata.name, self.namespace, body=body)
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or replaced (uid precondition)
                raise

    def create_config(self, manifest: dict[str, Any]) -> None:
        """Create a ConfigMap or a Secret (a job's files, its token)."""
        core = self.hook.core_v1_client
        create = core.create_namespaced_secret if manifest["kind"] == "Secret" else core.create_namespaced_config_map
        self.call(create, self.namespace, manifest)

    def token_secrets(self) -> list[Any]:
        """Every job-token Secret of the namespace (``job_token.py``), in one listing."""
        return self.list_all(
            self.hook.core_v1_client.list_namespaced_secret,
            namespace=self.namespace,
            label_selector=TOKEN_SECRET_LABEL,
        )

    def patch_secret_data(self, name: str, data: dict[str, str]) -> bool:
        """Replace keys of Secret ``name``'s data; False when it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.call(self.hook.core_v1_client.patch_namespaced_secret, name, self.namespace, {"data": data})
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def create_service(self, manifest: dict[str, Any]) -> None:
        self.hook.core_v1_client.create_namespaced_service(
            self.namespace, manifest, _request_timeout=self.request_timeout
        )

    def pods(self, selector: str) -> list[Any]:
        return self.list_all(
            self.hook.core_v1_client.list_namespaced_pod, namespace=self.namespace, label_selector=selector
        )

    def pod_log(self, pod: Any, container: str, since_seconds: int | None) -> bytes | None:
        """The container's output with timestamps (raw bytes: it need not be UTF-8); None when the pod
        has not started or is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.call(
                self.hook.core_v1_client.read_namespaced_pod_log,
                pod.metadata.name,
                self.namespace,
                container=container,
                timestamps=True,
                since_seconds=since_seconds,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status in (400, 404):  # not started yet, or gone
                return None
            raise
        data: bytes = response.data
        return data

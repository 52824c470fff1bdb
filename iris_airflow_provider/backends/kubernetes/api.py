"""The ``kubernetes`` backend's calls to the API server, through the cncf-kubernetes provider's hook.

Every call takes the request timeout; every list is paged. ``guard`` turns the API's failures
into ``KubernetesUnavailableError`` (an ``OSError``: the agentless peer reports it as
unavailable, and the tick retries with backoff), naming what was being done. The Kubernetes
client is untyped: its objects are ``Any`` here and in the pure modules that read them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

LIST_PAGE = 500


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


class KubeApi:
    """One backend's view of one cluster: its connection, namespace and the calls it makes."""

    def __init__(self, backend_id: str, conn_id: str, namespace: str = "", request_timeout: float = 20) -> None:
        self.backend_id = backend_id
        self.conn_id = conn_id
        self._namespace = namespace
        self.request_timeout = request_timeout
        self._hook: Any = None

    @property
    def hook(self) -> Any:
        if self._hook is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
            from kubernetes.client import Configuration

            # Our own configuration object: the hook would otherwise load the kubeconfig into the
            # process-wide default, which another backend (another cluster) may be using.
            self._hook = KubernetesHook(conn_id=self.conn_id, client_configuration=Configuration())
        return self._hook

    @property
    def namespace(self) -> str:
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

    def list_all(self, call: Callable[..., Any], **kwargs: Any) -> list[Any]:
        items: list[Any] = []
        token = None
        while True:
            page = call(limit=LIST_PAGE, _continue=token, _request_timeout=self.request_timeout, **kwargs)
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
            return self.hook.batch_v1_client.read_namespaced_job(
                name, self.namespace, _request_timeout=self.request_timeout
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_job(self, manifest: dict[str, Any]) -> Any:
        return self.hook.batch_v1_client.create_namespaced_job(
            self.namespace, manifest, _request_timeout=self.request_timeout
        )

    def delete_job(self, job: Any, propagation: str) -> None:
        """Delete this Job (by uid: not one that replaced it); a Job already gone is fine."""
        from kubernetes.client.exceptions import ApiException

        body = {"propagationPolicy": propagation, "preconditions": {"uid": job.metadata.uid}}
        try:
            self.hook.batch_v1_client.delete_namespaced_job(
                job.metadata.name, self.namespace, body=body, _request_timeout=self.request_timeout
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or replaced (uid precondition)
                raise

    def create_files(self, manifest: dict[str, Any]) -> None:
        core = self.hook.core_v1_client
        create = core.create_namespaced_secret if manifest["kind"] == "Secret" else core.create_namespaced_config_map
        create(self.namespace, manifest, _request_timeout=self.request_timeout)

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
            response = self.hook.core_v1_client.read_namespaced_pod_log(
                pod.metadata.name,
                self.namespace,
                container=container,
                timestamps=True,
                since_seconds=since_seconds,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except ApiException as error:
            if error.status in (400, 404):  # not started yet, or gone
                return None
            raise
        data: bytes = response.data
        return data

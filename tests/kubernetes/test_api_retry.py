"""The backend honours the API server's ``429 Too Many Requests`` with ``Retry-After`` (the cncf
provider's retry policy): a real HTTP proxy in front of the real control plane answers chosen
requests with 429 first, and the backend's calls wait as told, then succeed."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.api import KubernetesUnavailableError
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend, job_name
from iris_airflow_provider.core.model import parse_job
from tests.kubernetes.peer_namespace import peer_namespace

pytestmark = pytest.mark.kubernetes
NAMESPACE = "iris-api-retry"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


@dataclass
class ThrottlingProxy:
    """Forwards every request to the API server, but answers the next ``times`` requests of a
    (method, path) with 429 and ``Retry-After``; records every request it saw, with its time."""

    upstream: str
    ca: ssl.SSLContext
    throttled: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # -> (times, retry_after)
    seen: list[tuple[str, str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def throttle(self, method: str, path: str, *, times: int, retry_after: int) -> None:
        with self.lock:
            self.throttled[(method, path)] = (times, retry_after)

    def requests(self, method: str, path: str) -> list[float]:
        with self.lock:
            return [at for m, p, at in self.seen if (m, p) == (method, path)]

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        path = urlsplit(handler.path).path
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        with self.lock:
            self.seen.append((handler.command, path, time.monotonic()))
            times, retry_after = self.throttled.get((handler.command, path), (0, 0))
            if times:
                self.throttled[(handler.command, path)] = (times - 1, retry_after)
        if times:
            status = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429}
            self._answer(handler, 429, {"Retry-After": str(retry_after)}, json.dumps(status).encode())
            return
        target = urlsplit(self.upstream)
        upstream = http.client.HTTPSConnection(target.hostname or "", target.port, context=self.ca, timeout=30)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream.request(handler.command, handler.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            answer = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            self._answer(handler, response.status, kept, answer)
        finally:
            upstream.close()

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


@contextlib.contextmanager
def serving(proxy: ThrottlingProxy) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            proxy.handle(self)

        do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def setup(real_kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThrottlingProxy, Any]]:
    """The namespace as the README sets it up; the backend's connection goes through the proxy
    with the service account's token."""
    ca = ssl.create_default_context(cafile=str(real_kube.pki.ca_path))
    proxy = ThrottlingProxy(real_kube.url, ca)
    with (
        peer_namespace(real_kube, NAMESPACE, gpu_quota=0) as peer,
        serving(proxy) as url,
        pytest.MonkeyPatch.context() as patch,
        real_kube.admin_client() as admin,
    ):
        kubeconfig = json.loads(peer.kubeconfig.read_text())
        kubeconfig["clusters"][0]["cluster"] = {"server": url}
        path = Path(tmp_path_factory.mktemp("proxy")) / "through-proxy.kubeconfig"
        path.write_text(json.dumps(kubeconfig))
        extra = {"kube_config_path": str(path), "namespace": NAMESPACE}
        patch.setenv("AIRFLOW_CONN_IRIS_KUBE_PROXY", json.dumps({"conn_type": "kubernetes", "extra": extra}))
        yield proxy, admin


def backend() -> KubernetesBackend:
    return KubernetesBackend("throttled", conn_id="iris_kube_proxy", namespace=NAMESPACE, image="busybox:1.36")


def test_a_429_is_waited_out_as_retry_after_says_and_the_call_succeeds(
    setup: tuple[ThrottlingProxy, Any], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, admin = setup
    caplog.set_level(logging.WARNING, logger="iris_airflow_provider.backends.kubernetes.api")
    kube = backend()
    proxy.throttle("GET", "/api/v1/nodes", times=1, retry_after=2)
    started = time.monotonic()
    kube.api.nodes()  # through the proxy: the first answer is 429
    assert time.monotonic() - started >= 2
    first, second = proxy.requests("GET", "/api/v1/nodes")
    assert second - first >= 2, "the retry waited as Retry-After said"
    (waited,) = [r for r in caplog.records if r.name == "iris_airflow_provider.backends.kubernetes.api"]
    assert "list_node in 2 seconds" in waited.getMessage()  # the provider's policy waited, and said so

    # A create throttled once is retried, and makes one Job.
    spec = parse_job({"job_id": f"/alice/throttled-{uuid.uuid4().hex[:8]}", "command": "true"})
    jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    proxy.throttle("POST", jobs, times=1, retry_after=1)
    outcome = kube.submit(Submission(spec.job_id, uuid.uuid4().hex, spec, "marin", 1_000))
    assert outcome.report.job_id == spec.job_id and not outcome.replay
    assert len(proxy.requests("POST", jobs)) == 2
    (created,) = client.BatchV1Api(admin).list_namespaced_job(NAMESPACE).items
    assert created.metadata.name == job_name(spec.job_id)
    kube.cancel(spec.job_id)


def test_a_server_that_keeps_answering_429_is_reported_unavailable_after_the_providers_attempts(
    setup: tuple[ThrottlingProxy, Any],
) -> None:
    from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import API_RETRIES

    proxy, _ = setup
    proxy.throttle("GET", "/api/v1/nodes", times=100, retry_after=1)
    before = len(proxy.requests("GET", "/api/v1/nodes"))
    with pytest.raises(KubernetesUnavailableError, match="listing nodes: HTTP 429"):
        backend().api.nodes()
    assert len(proxy.requests("GET", "/api/v1/nodes")) - before == API_RETRIES
    proxy.throttle("GET", "/api/v1/nodes", times=0, retry_after=0)

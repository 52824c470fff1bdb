"""A backend configured only with ``gke:`` reaches the real control plane through the google
provider's GKE hooks: a stand-in for Google (a local HTTP server) answers the Container API's
get-cluster call with the control plane's endpoint and CA, and the OAuth token endpoint the Google
Cloud connection's service-account key names. google-auth really signs its JWT grant with the key
(checked here with the public half) and really refreshes; the token it gets back is a Kubernetes
service-account token bound to the README's RBAC, the only credential the backend has, as Google's
tokens are on GKE. Kueue then admits the job the backend submits."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.api import KubernetesUnavailableError
from iris_airflow_provider.backends.kubernetes.backend import KubernetesBackend, job_name
from iris_airflow_provider.cluster.build import build_local_backends
from iris_airflow_provider.cluster.config import parse_cluster_config
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from tests.kubernetes.peer_namespace import KUEUE, QUEUE, peer_namespace
from tests.waiting import wait_for, wait_state

pytestmark = pytest.mark.kubernetes
NAMESPACE = "iris-gke"
CONN = "iris_gcp"
PROJECT, LOCATION, CLUSTER = "iris-test-project", "us-central1", "marin-v5p"
SERVICE_ACCOUNT = f"iris-federation@{PROJECT}.iam.gserviceaccount.com"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


@dataclass
class GoogleStandIn:
    """The stand-in: what it was asked, and what it answers with."""

    public_key: bytes
    access_token: str  # handed out for a valid JWT grant
    clusters: dict[str, dict[str, Any]]  # "projects/p/locations/l/clusters/c" -> the Cluster resource
    url: str = ""
    grants: list[dict[str, Any]] = field(default_factory=list)  # the verified claims of each token request
    cluster_calls: list[tuple[str, str]] = field(default_factory=list)  # (path, how the caller authenticated)

    def authenticated(self, header: str) -> str | None:
        """``token`` for the token we issued, ``jwt`` for a JWT the key signed, None for anything else."""
        import google.auth.jwt

        if not header.startswith("Bearer "):
            return None
        bearer = header.removeprefix("Bearer ")
        if bearer == self.access_token:
            return "token"
        try:
            claims = google.auth.jwt.decode(bearer, certs=self.public_key.decode(), verify=True)
        except ValueError:
            return None
        return "jwt" if claims.get("iss") == SERVICE_ACCOUNT else None


def _handler(standin: GoogleStandIn) -> type[BaseHTTPRequestHandler]:
    import google.auth.jwt

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path != "/token":
                return self._answer(404, {"error": "not_found"})
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            if form.get("grant_type") != [JWT_BEARER]:
                return self._answer(400, {"error": "unsupported_grant_type"})
            try:  # signed by the key, for Google's token endpoint (google-auth's audience wherever it posts)
                claims = google.auth.jwt.decode(
                    form["assertion"][0], certs=standin.public_key.decode(), audience=GOOGLE_TOKEN_AUDIENCE
                )
            except (KeyError, ValueError) as error:
                return self._answer(400, {"error": "invalid_grant", "error_description": str(error)})
            standin.grants.append(claims)
            # A token that lives 60 s is inside google-auth's refresh margin (3 min 45 s): it is
            # refreshed before each use, as a long-running backend's hourly tokens are near their end.
            answer = {"access_token": standin.access_token, "expires_in": 60, "token_type": "Bearer"}
            return self._answer(200, answer)

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path.removeprefix("/v1/")
            how = standin.authenticated(self.headers.get("Authorization", ""))
            standin.cluster_calls.append((path, how or ""))
            if how is None:
                return self._answer(
                    401, {"error": {"code": 401, "message": "unauthenticated", "status": "UNAUTHENTICATED"}}
                )
            if path not in standin.clusters:
                message = f"Not found: {path}."
                return self._answer(404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}})
            return self._answer(200, standin.clusters[path])

    return Handler


@contextlib.contextmanager
def google_standin(
    public_key: bytes, access_token: str, clusters: dict[str, dict[str, Any]]
) -> Iterator[GoogleStandIn]:
    standin = GoogleStandIn(public_key, access_token, clusters)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(standin))
    standin.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def service_account_key(token_uri: str) -> tuple[dict[str, str], bytes]:
    """A service-account key JSON, as Google issues them (a fresh RSA key), and its public half."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    document = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": uuid.uuid4().hex,
        "private_key": private,
        "client_email": SERVICE_ACCOUNT,
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    }
    return document, public


def cluster_path(name: str = CLUSTER) -> str:
    return f"projects/{PROJECT}/locations/{LOCATION}/clusters/{name}"


@dataclass(frozen=True)
class Gke:
    admin: Any  # the control plane's admin client, for the test's own checks
    standin: GoogleStandIn


@pytest.fixture(scope="module")
def gke(real_kube: KubeCluster) -> Iterator[Gke]:
    """The namespace as the README sets it up; the stand-in answering for a cluster whose endpoint and
    CA are the real control plane's, handing out the namespace's service-account token; the Google
    Cloud connection ``iris_gcp`` holding the key (its project is the key's)."""
    with peer_namespace(real_kube, NAMESPACE, gpu_quota=0) as peer, real_kube.admin_client() as admin:
        token = json.loads(peer.kubeconfig.read_text())["users"][0]["user"]["token"]
        cluster = {
            "name": CLUSTER,
            "location": LOCATION,
            "endpoint": real_kube.url.removeprefix("https://"),
            "masterAuth": {"clusterCaCertificate": base64.b64encode(real_kube.pki.ca_path.read_bytes()).decode()},
            "status": "RUNNING",
        }
        # The key needs the stand-in's address, the stand-in the key's public half: start, then fill in.
        with google_standin(b"", token, {cluster_path(): cluster}) as standin, pytest.MonkeyPatch.context() as patch:
            key, standin.public_key = service_account_key(f"{standin.url}/token")
            extra = {"keyfile_dict": json.dumps(key)}
            patch.setenv(
                f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
            )
            yield Gke(admin, standin)


def gke_backend(standin: GoogleStandIn, cluster_name: str = CLUSTER) -> KubernetesBackend:
    """Built from a cluster file whose backend names a GKE cluster and no Kubernetes connection."""
    gke_block = {"gcp_conn_id": CONN, "location": LOCATION, "cluster_name": cluster_name, "api_endpoint": standin.url}
    document = {
        "name": "marin",
        "backends": [
            {
                "id": "gke",
                "kind": "kubernetes",
                "gke": gke_block,
                "namespace": NAMESPACE,
                "queue_name": QUEUE,
                "image": "busybox:1.36",
            }
        ],
    }
    backend = build_local_backends(parse_cluster_config(document))["gke"]
    assert isinstance(backend, KubernetesBackend)
    return backend


def test_a_backend_named_by_gke_submits_a_job_that_kueue_admits(gke: Gke) -> None:
    backend = gke_backend(gke.standin)
    # The heartbeat's cluster-wide reads work with the credentials the hooks got (the README's RBAC).
    assert backend.describe().backend_id == "gke"
    # One get-cluster call, with a JWT the key signed (google's clients sign their own for a
    # service account, as Google accepts); the Kubernetes token came from a grant the key signed.
    assert gke.standin.cluster_calls == [(cluster_path(), "jwt")]
    assert gke.standin.grants, "google-auth never asked the token endpoint"
    assert {grant["iss"] for grant in gke.standin.grants} == {SERVICE_ACCOUNT}
    assert "https://www.googleapis.com/auth/cloud-platform" in gke.standin.grants[0]["scope"].split()
    grants_before = len(gke.standin.grants)

    spec = parse_job({"job_id": f"/alice/gke-{uuid.uuid4().hex[:6]}", "command": "true"})
    backend.submit(Submission(spec.job_id, uuid.uuid4().hex, spec, "marin", 1_000))
    try:
        report = wait_state(backend, spec.job_id, JobState.ACCEPTED, JobState.RUNNING, JobState.SUCCEEDED, timeout=60)
        assert report.error == ""
        name = job_name(spec.job_id)
        job = client.BatchV1Api(gke.admin).read_namespaced_job(name, NAMESPACE)
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
        assert job.spec.suspend is False  # Kueue unsuspended it: admitted

        def admitted() -> dict[str, Any] | None:
            workloads = client.CustomObjectsApi(gke.admin).list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")
            for workload in workloads["items"]:
                conditions = workload.get("status", {}).get("conditions", [])
                if workload["metadata"]["ownerReferences"][0]["name"] == name and any(
                    c["type"] == "Admitted" and c["status"] == "True" for c in conditions
                ):
                    return dict(workload)
            return None

        workload = wait_for(admitted, "Kueue's workload of the job to be admitted", timeout=30)
        assert workload["status"]["admission"]["clusterQueue"] == NAMESPACE
        # The expiring token was refreshed for the later calls, through the same grant.
        assert len(gke.standin.grants) > grants_before
    finally:
        backend.cancel(spec.job_id)
    wait_for(
        lambda: not client.BatchV1Api(gke.admin).list_namespaced_job(NAMESPACE).items,
        "the Job to be deleted",
        timeout=60,
    )


def test_a_cluster_google_does_not_know_makes_the_backend_unavailable_naming_it(gke: Gke) -> None:
    backend = gke_backend(gke.standin, cluster_name="nowhere")
    started = time.monotonic()
    with pytest.raises(KubernetesUnavailableError) as error:
        backend.describe()
    assert str(error.value).startswith(
        f"backend gke: fetching GKE cluster nowhere (the connection's project, location {LOCATION})"
        f" with connection {CONN}: 404"
    )
    assert f"Not found: {cluster_path('nowhere')}" in str(error.value)
    assert time.monotonic() - started < 30

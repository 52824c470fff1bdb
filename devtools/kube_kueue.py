"""Kueue installed as a local process: its CRDs and webhook configurations from its module source
(copied beside the binaries by ``scripts/kube-binaries.sh``), and its configuration file.

In a cluster each webhook names a Service in front of Kueue's pod; here the webhook server is a
process on loopback, so every ``clientConfig`` (admission webhooks and the CRDs' conversion
webhooks) becomes a URL on 127.0.0.1 with our CA. Kueue's own certificate rotator stays on (it
also guards startup): it finds our secret valid, keeps it, and re-injects the same CA.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # only named in the webhook cert; nothing resolves it
SECRET = "kueue-webhook-server-cert"
# The only integration the backend uses; Kueue serves no-op webhooks for the others.
FRAMEWORKS = ["batch/job"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def install(api: Any, manifests: Path, webhook_url: str, ca: bytes, secret: dict[str, bytes], timeout: float) -> None:
    """Create Kueue's CRDs, namespace, cert secret and webhook configurations; wait for the CRDs."""
    from kubernetes import client

    crd_dir, webhook_dir = manifests / "crd", manifests / "webhook"
    # The CRDs kustomize would patch to convert through the webhook (v1beta1 <-> v1beta2).
    patches = yaml.safe_load((crd_dir / "kustomization.yaml").read_text()).get("patches", [])
    converted = {yaml.safe_load((crd_dir / p["path"]).read_text())["metadata"]["name"] for p in patches}
    # Namespace selectors kustomize adds (pod, deployment, statefulset webhooks skip system namespaces).
    selectors = {
        hook["name"]: hook["namespaceSelector"]
        for patch in yaml.safe_load((webhook_dir / "kustomization.yaml").read_text())["patches"]
        for hook in yaml.safe_load(patch["patch"])["webhooks"]
    }
    extensions = client.ApiextensionsV1Api(api)
    for path in sorted((crd_dir / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{webhook_url}/convert", "caBundle": _b64(ca)},
                    "conversionReviewVersions": ["v1"],
                },
            }
        extensions.create_custom_resource_definition(crd)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    secret_body = {"metadata": {"name": SECRET}, "data": {k: _b64(v) for k, v in secret.items()}}
    core.create_namespaced_secret(NAMESPACE, secret_body)
    admission = client.AdmissionregistrationV1Api(api)
    for doc in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]  # kustomize's namePrefix
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {"url": webhook_url + hook["clientConfig"]["service"]["path"], "caBundle": _b64(ca)}
            if hook["name"] in selectors:
                hook["namespaceSelector"] = selectors[hook["name"]]
        if doc["kind"] == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(doc)
        else:
            admission.create_validating_webhook_configuration(doc)
    deadline = time.monotonic() + timeout
    while not all(
        any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
        for crd in extensions.list_custom_resource_definition().items
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("Kueue's CRDs were not established")
        time.sleep(0.25)


def configuration(*, health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's configuration file: loopback only, no leader election, no metrics server."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
        "integrations": {"frameworks": FRAMEWORKS},
    }

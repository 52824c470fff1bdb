"""A Kubernetes job's token for the job API: in a Secret of its own, mounted as a file, never in the
Job's environment.

An environment value is written into the Job's spec, where anyone who may read Jobs in the namespace
reads it, and is fixed for the pod's life: a job Kueue holds longer than the token lives would start
with an expired one and could never trade it for a fresh one. So the token lives in a Secret owned by
the Job (one per incarnation, gone with it), mounted read-only at ``TOKEN_DIR``; the pod is told the
file (``$IRIS_JOB_TOKEN_FILE``), which ``iris_airflow_provider.client`` reads on each call; and the
placement tick rewrites the Secret before the token in it is half spent (``due``), which the kubelet
carries into the mounted file of a queued or running pod alike.

Pure: no API calls, no clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from iris_airflow_provider.backends.base import JOB_TOKEN_ENV, JOB_TOKEN_FILE_ENV

TOKEN_DIR = "/var/run/iris/job-token"
TOKEN_KEY = "token"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_KEY}"
TOKEN_VOLUME = "iris-job-token"
TOKEN_SECRET_LABEL = "iris.marin.community/job-token"  # what the tick lists the Secrets by


def token_secret_name(name: str, nonce: str) -> str:
    """The Secret of Job ``name``'s incarnation ``nonce`` (a replaced Job's may still be going)."""
    return f"{name}-token-{hashlib.sha1(nonce.encode()).hexdigest()[:8]}"


def token_env(job_env: Mapping[str, str]) -> dict[str, str]:
    """What the container is told of the job API: the job's env less the token, plus where its file is
    (when the cluster issues tokens at all)."""
    env = {key: value for key, value in job_env.items() if key != JOB_TOKEN_ENV}
    if JOB_TOKEN_ENV in job_env:
        env[JOB_TOKEN_FILE_ENV] = TOKEN_PATH
    return env


def token_volume(secret_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's volume of the Secret and the container's read-only mount of it (a whole directory:
    the kubelet updates a Secret volume in place only when it is not mounted by ``subPath``)."""
    volume = {"name": TOKEN_VOLUME, "secret": {"secretName": secret_name, "defaultMode": 0o444}}
    mount = {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}
    return volume, mount


def token_data(token: str) -> dict[str, str]:
    return {TOKEN_KEY: base64.b64encode(token.encode()).decode()}


def token_secret_manifest(metadata: dict[str, Any], token: str) -> dict[str, Any]:
    """The Secret holding ``token``, with the Job-owned ``metadata`` it is given, marked for listing."""
    labels = {**metadata.get("labels", {}), TOKEN_SECRET_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {**metadata, "labels": labels},
        "data": token_data(token),
    }


def token_expiry(data: Mapping[str, str] | None) -> int | None:
    """When the token in a Secret's ``data`` expires (its JWT's ``exp``, read, not verified: only the
    job API verifies tokens); None when the Secret holds no readable token, so it is renewed."""
    try:
        token = base64.b64decode((data or {})[TOKEN_KEY]).decode()
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        expires = claims["exp"]
    except (KeyError, IndexError, ValueError, TypeError, binascii.Error):
        return None
    return expires if isinstance(expires, int) and not isinstance(expires, bool) else None

"""A Kubernetes job's token (pure manifests; the contract suite renews one on the real control
plane): the Job names the file, the token is only in the incarnation's Secret, and the expiry the
tick renews by is read from the Secret, an unreadable one counting as due."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import jwt
import pytest

from iris_airflow_provider.backends.base import Submission
from iris_airflow_provider.backends.kubernetes.job_token import (
    TOKEN_PATH,
    TOKEN_SECRET_LABEL,
    token_data,
    token_expiry,
    token_secret_name,
)
from iris_airflow_provider.backends.kubernetes.manifests import JobPlacement, JobTemplate
from iris_airflow_provider.backends.kubernetes.names import job_name
from iris_airflow_provider.core.model import parse_job

TOKEN = jwt.encode({"sub": "k", "exp": 1_900_000_000}, "k" * 32, algorithm="HS256")
SPEC = parse_job({"job_id": "/alice/coordinator", "command": "run", "resources": {"replicas": 2}})
TEMPLATE = JobTemplate(backend_id="default", image="busybox:1.36")


def submission(job_env: dict[str, str]) -> Submission:
    return Submission(SPEC.job_id, "n1", SPEC, "marin", 0, job_env=job_env)


def pod_spec(job_env: dict[str, str]) -> dict[str, Any]:
    job = TEMPLATE.job_manifest(submission(job_env), JobPlacement(), "iris")
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_the_job_names_the_token_file_and_mounts_its_secret_but_never_holds_the_token() -> None:
    job_env = {"IRIS_FEDERATION_URL": "https://marin.example/", "IRIS_JOB_TOKEN": TOKEN}
    job = TEMPLATE.job_manifest(submission(job_env), JobPlacement(), "iris")
    assert TOKEN not in json.dumps(job)
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["IRIS_JOB_TOKEN_FILE"] == TOKEN_PATH and "IRIS_JOB_TOKEN" not in env
    assert env["IRIS_FEDERATION_URL"] == "https://marin.example/"
    secret = token_secret_name(job_name(SPEC.job_id), "n1")
    [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    # Mounted whole (no subPath): only then does the kubelet carry a renewed token into the file.
    assert mount == {"name": volume["name"], "mountPath": TOKEN_PATH.rsplit("/", 1)[0], "readOnly": True}


def test_a_cluster_that_issues_no_tokens_mounts_no_secret() -> None:
    pod = pod_spec({"IRIS_FEDERATION_URL": "https://marin.example/"})
    assert not [v for v in pod["volumes"] if "secret" in v]
    [container] = pod["containers"]
    assert "IRIS_JOB_TOKEN_FILE" not in {e["name"] for e in container["env"]}


def test_the_secret_is_the_incarnations_owned_by_its_job_and_listed_by_its_label() -> None:
    job = SimpleNamespace(metadata=SimpleNamespace(name="iris-job", uid="u1", labels={"app": "iris"}))
    secret = TEMPLATE.token_manifest(job, submission({"IRIS_JOB_TOKEN": TOKEN}), "iris")
    assert secret["metadata"]["name"] == token_secret_name("iris-job", "n1") != token_secret_name("iris-job", "n2")
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "iris-job", "uid": "u1"}
    ]
    assert secret["metadata"]["labels"] == {"app": "iris", TOKEN_SECRET_LABEL: "true"}
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert token_expiry(secret["data"]) == 1_900_000_000


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        token_data("not-a-jwt"),
        token_data("a.!!!.c"),
        token_data("a." + base64.urlsafe_b64encode(b"[1]").decode() + ".c"),
        token_data(jwt.encode({"exp": "soon"}, "k" * 32, algorithm="HS256")),
        token_data(jwt.encode({"exp": True}, "k" * 32, algorithm="HS256")),
        {"token": "%%%"},
    ],
    ids=["no-data", "no-token", "not-a-jwt", "bad-base64", "claims-not-an-object", "exp-text", "exp-bool", "garbled"],
)
def test_a_secret_without_a_readable_expiry_reads_as_none_so_it_is_renewed(data: Any) -> None:
    assert token_expiry(data) is None

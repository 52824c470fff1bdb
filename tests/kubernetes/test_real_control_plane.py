"""Smoke test of the real control plane: Kueue admits a queued Job, the scheduler places its pod
on a KWOK node by its GPUs, and KWOK runs it to completion."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from devtools.kube_cluster import KubeCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.kubernetes
KUEUE = ("kueue.x-k8s.io", "v1beta2")
NS = "smoke"


@pytest.fixture(scope="module")
def api(real_kube: KubeCluster) -> Any:
    """A namespace with a LocalQueue on a ClusterQueue of 8 GPUs, and one KWOK node with 8 GPUs (all
    removed after the module)."""
    real_kube.create_node("gpu-node-1", gpus=8, labels={"node.kubernetes.io/instance-type": "gpu-8"})
    with real_kube.admin_client() as api:
        custom = client.CustomObjectsApi(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        custom.create_cluster_custom_object(
            *KUEUE,
            "resourceflavors",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpu"}},
        )
        quota = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
        custom.create_cluster_custom_object(
            *KUEUE,
            "clusterqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": "cq"},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": list(quota),
                            "flavors": [
                                {"name": "gpu", "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}
                            ],
                        }
                    ],
                },
            },
        )
        custom.create_namespaced_custom_object(
            *KUEUE,
            NS,
            "localqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": "cq"},
            },
        )
        yield api
        # Leave the shared control plane as we found it: other modules count every node.
        client.CoreV1Api(api).delete_namespace(NS)
        custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", "cq")
    real_kube.delete_node("gpu-node-1")


def job(name: str, *, suspend: bool | None) -> dict[str, Any]:
    resources = {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    spec: dict[str, Any] = {
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox", "command": ["true"], "resources": resources}],
            }
        }
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": spec,
    }


def test_kueue_admits_a_suspended_job_and_kwok_runs_its_pod(api: Any) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(NS, job("train", suspend=True))

    wait_for(
        lambda: batch.read_namespaced_job("train", NS).spec.suspend is False, "Kueue unsuspends the Job", timeout=60
    )
    pod = wait_for(
        lambda: next(
            (
                p
                for p in core.list_namespaced_pod(NS, label_selector="job-name=train").items
                if p.spec.node_name and p.status.phase in ("Running", "Succeeded")
            ),
            None,
        ),
        "the Job's pod is scheduled and running",
        timeout=60,
    )
    assert pod.spec.node_name == "gpu-node-1"
    wait_for(
        lambda: any(
            c.type == "Complete" and c.status == "True"
            for c in batch.read_namespaced_job("train", NS).status.conditions or []
        ),
        "the Job completes",
        timeout=60,
    )


def test_kueue_webhooks_answer_over_tls(api: Any) -> None:
    """Kueue's webhooks are live on loopback: the mutating one suspends a queued Job created running,
    and the conversion one serves a ClusterQueue stored as v1beta2 at v1beta1."""
    created = client.BatchV1Api(api).create_namespaced_job(NS, job("queued", suspend=False))
    assert created.spec.suspend is True
    old = client.CustomObjectsApi(api).get_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "clusterqueues", "cq")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"

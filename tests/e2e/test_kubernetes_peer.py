"""End to end: an Airflow deployment whose peer ``cw-k8s`` is a Kubernetes cluster with Kueue (the
real control plane of ``devtools/kube_cluster.py``), driven directly (agentless) through a
``kubernetes`` connection holding a service account token with the README's RBAC.

A GPU job triggered through the REST API is placed on the peer from its heartbeat, runs there as a
batch/v1 Job admitted by Kueue (its two nodes run each pod's real command), and the DAG run
succeeds; a failing job is mirrored with its exit code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devtools.airflow_deployment import AirflowDeployment
from devtools.kube_cluster import KubeCluster
from iris_airflow_provider.backends.kubernetes.backend import JOB_KEY_LABEL, NONCE_ANNOTATION, job_key
from iris_airflow_provider.core.states import JobState
from tests.e2e.conftest import free_port, save_logs
from tests.kubernetes.peer_namespace import H100, PeerNamespace, peer_namespace
from tests.postgres import scratch_database

pytestmark = [pytest.mark.e2e, pytest.mark.kubernetes]

NAMESPACE = "iris"
PRODUCT = "nvidia.com/gpu.product"
NODES = ("h100-0", "h100-1")
CLUSTER = f"""
name: marin
placement:
  tick_interval_seconds: 30
  sync_interval_seconds: 2
backends:
  - {{id: cpu, kind: process, max_running_jobs: 2}}
peers:
  - id: cw-k8s
    kind: agentless
    allowed_submitters: [alice]
    backends:
      - id: default
        kind: kubernetes
        conn_id: kube_cw_k8s
        namespace: {NAMESPACE}
        queue_name: iris
        priority_classes: {{production: iris-production, interactive: iris-interactive, batch: iris-batch}}
        variant_label: {PRODUCT}
        variant_values: {{NVIDIA-H100-80GB-HBM3: h100}}
        image: busybox:1.36
        attributes: {{region: [us-east-04]}}
"""


@pytest.fixture(scope="module")
def kube(real_kube: KubeCluster) -> Iterator[PeerNamespace]:
    try:
        for node in NODES:
            real_kube.create_command_node(node, gpus=8, labels={PRODUCT: H100})
        with peer_namespace(real_kube, NAMESPACE, gpu_quota=16) as peer:
            yield peer
    finally:
        for node in NODES:
            real_kube.delete_node(node)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, kube: PeerNamespace) -> Iterator[AirflowDeployment]:
    home = tmp_path_factory.mktemp("airflow-k8s-parent")
    with scratch_database("iris_e2e_k8s_meta") as metadata_url, scratch_database("iris_e2e_k8s_store") as store_url:
        deployment = AirflowDeployment(
            home=home,
            port=free_port(),
            metadata_url=metadata_url,
            store_url=store_url,
            dags_folder=Path(__file__).parent / "dags",
            # As on managed Airflow: no file, the cluster configuration is a Variable in the metadata
            # database, which every component (the tick's DAG file, workers, triggerer) reads.
            variables={"iris_cluster": CLUSTER},
            extra_env={
                "AIRFLOW__IRIS_FEDERATION__CLUSTER_CONFIG_VARIABLE": "iris_cluster",
                "AIRFLOW_CONN_KUBE_CW_K8S": kube.connection(),
            },
        )
        try:
            deployment.start()
            deployment.wait_for_dag("iris_federation_tick")
            deployment.wait_for_dag("e2e_job")
            yield deployment
        finally:
            deployment.stop()
            save_logs(deployment, "kubernetes-parent")


def gpu(count: int, command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "resources": {"device": {"type": "gpu", "variant": "h100", "count": count}, **extra}}


def test_a_gpu_job_runs_on_the_kubernetes_peer_and_the_run_succeeds(deployment, store, kube):
    command = (
        'echo "training on $IRIS_DEVICE_VARIANT as replica $IRIS_REPLICA_INDEX"'
        '; echo "{\\"replica\\": $IRIS_REPLICA_INDEX, \\"loss\\": 0.25}" > "$IRIS_RESULT"'
    )
    job = gpu(2, command, replicas=2)
    run = deployment.trigger("e2e_job", {"job": job}, user="alice")
    assert deployment.wait_for_run("e2e_job", run, timeout=180) == "success"
    result = deployment.xcom("e2e_job", run, "run")
    assert (result["disposition"], result["peer_id"], result["backend_id"]) == ("queue", "cw-k8s", "default")
    assert (result["state"], result["exit_code"]) == ("succeeded", 0)
    # What replica 0 wrote at $IRIS_RESULT came back from the cluster into the task's XCom.
    assert result["result"] == {"replica": 0, "loss": 0.25}
    record = store.get_job(result["job_id"])
    assert record.state is JobState.SUCCEEDED and record.submitting_user == "alice"
    # It ran on the cluster: one Job, of this incarnation, whose two pods succeeded.
    with kube.kube.admin_client() as admin:
        jobs = client.BatchV1Api(admin).list_namespaced_job(
            NAMESPACE, label_selector=f"{JOB_KEY_LABEL}={job_key(record.job_id)}"
        )
    [k8s_job] = jobs.items
    assert k8s_job.metadata.annotations[NONCE_ANNOTATION] == record.nonce
    assert k8s_job.metadata.labels["kueue.x-k8s.io/queue-name"] == "iris"
    assert k8s_job.spec.template.spec.priority_class_name == "iris-interactive"
    assert k8s_job.status.succeeded == 2
    # Its output was read from the pods and relayed into the store, for the waiting task; the two
    # replicas run at once, so their lines arrive in either order.
    relayed = [line for _, line in store.log_lines(record.job_id)]
    assert sorted(relayed) == ["[replica 0] training on h100 as replica 0", "[replica 1] training on h100 as replica 1"]
    heartbeat = {p.peer_id: p for p in store.peer_states()}["cw-k8s"]
    [backend] = heartbeat.backends
    assert backend.kind == "kubernetes" and backend.availability.total_amounts == {"h100": 16}
    # The api-server built its federation from the Variable too: its Federation page knows the peer.
    overview = deployment.api("GET", "/iris/federation/ui/api/peers")
    assert overview.status_code == 200, overview.text
    assert "cw-k8s" in overview.text


def test_a_job_failing_on_the_kubernetes_peer_fails_the_run_with_its_exit_code(deployment, store):
    run = deployment.trigger("e2e_job", {"job": gpu(1, "echo bad; exit 7")}, user="alice")
    assert deployment.wait_for_run("e2e_job", run, timeout=180) == "failed"
    job_id = str(deployment.xcom("e2e_job", run, "run", key="iris_federation_job_id"))
    record = store.get_job(job_id)
    assert (record.state, record.exit_code, record.peer_id) == (JobState.FAILED, 7, "cw-k8s")
    assert "Replica 0 exited with code 7" in record.error
    log = deployment.task_log("e2e_job", run, "run")
    assert "is failed on peer cw-k8s" in log and "Replica 0 exited with code 7" in log

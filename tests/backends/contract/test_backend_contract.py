"""The contract every backend keeps, run against each: the ``process`` backend always, the
``kubernetes`` backend against the real control plane here and a cluster of yours when configured.

Scenarios: the heartbeat in the seed's shape, counting running work per band (on Kubernetes also
from a mix of gated, admitted, finished and unknown-class pods); delivering twice with one nonce
creates one incarnation; a job running to success and to failure with its exit code mirrored;
cancel stops it; refusals name the reason; a backend full of batch work still takes an interactive
job when bands allow; the two replicas of a job find each other through the rendezvous environment
(on Kubernetes through the Job's headless Service, admitted by Kueue as one gang). Where backends
legitimately differ, the scenario says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any, TypeVar

import httpx
import jwt
import pytest
from kubernetes import client

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    InsufficientCapacityError,
    JobReport,
    Submission,
    SubmissionRefusedError,
)
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.backends.kubernetes.backend import JOB_KEY_LABEL, job_key, job_name
from iris_airflow_provider.backends.kubernetes.capacity import UNATTRIBUTED_BAND, KubernetesAvailability
from iris_airflow_provider.backends.kubernetes.names import NONCE_LABEL, rendezvous_service_name
from iris_airflow_provider.core.availability import PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.bundles import BundleEntry
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.placement import Candidate, plan
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.peers.agentless import AgentlessPeer
from iris_airflow_provider.peers.base import Handoff, PeerError, PeerErrorCode
from tests import waiting
from tests.backends.contract.conftest import Target

T = TypeVar("T")
TIMEOUT = 60.0


# A real cluster schedules pods and pulls images: every wait allows a minute.
wait_for = partial(waiting.wait_for, timeout=TIMEOUT, interval=0.1)
wait_state = partial(waiting.wait_state, timeout=TIMEOUT)


def job(
    target: Target, command: str, *, gpus: int = 1, replicas: int = 1, band: str = "interactive", **extra: Any
) -> JobSpec:
    resources = {"device": {"type": "gpu", "variant": target.variant, "count": gpus}, "replicas": replicas}
    return parse_job(
        {
            "job_id": f"/alice/contract-{uuid.uuid4().hex[:8]}",
            "command": command,
            "resources": resources,
            "priority_band": band,
            **extra,
        }
    )


def submission(spec: JobSpec, nonce: str = "") -> Submission:
    return Submission(spec.job_id, nonce or uuid.uuid4().hex, spec, "marin", int(time.time() * 1000))


@pytest.fixture
def backend(target: Target) -> Iterator[Any]:
    backend = target.backend()
    created: list[str] = []
    original = backend.submit

    def tracking(sub: Submission) -> Any:
        created.append(sub.job_id)
        return original(sub)

    backend.submit = tracking  # type: ignore[method-assign]
    yield backend
    for job_id in created:  # leave the cluster as we found it
        backend.cancel(job_id)


def core(target: Target) -> client.CoreV1Api:
    return client.CoreV1Api(target.admin)


def test_the_heartbeat_reports_the_seeds_shape_and_what_running_work_holds_per_band(target, backend):
    described = backend.describe()
    assert described.backend_id == "default" and described.kind == ("kubernetes" if target.kubernetes else "process")
    assert target.variant in described.advertised["device-variant"] and described.advertised["region"] == ("test",)
    before = described.availability
    assert before is not None and target.variant in before.total_amounts
    if target.kubernetes and Band.BATCH not in target.priority_classes:
        pytest.skip("counting per band needs the batch band's PriorityClass: set IRIS_K8S_PRIORITY_CLASSES")
    spec = job(target, "echo held; sleep 300", gpus=2, band="batch")
    backend.submit(submission(spec))
    wait_state(backend, spec.job_id, JobState.RUNNING)
    variant = target.variant

    def counted() -> Any:
        now = backend.describe().availability
        grew = now.held_by_band.get(Band.BATCH, {}).get(variant, 0) - before.held_by_band.get(Band.BATCH, {}).get(
            variant, 0
        )
        return now if grew == 2 else None

    after = wait_for(counted, "the running job to be counted in its band")
    assert after.observation_epoch_ms >= before.observation_epoch_ms
    total, held = after.total_amounts[variant], sum(a.get(variant, 0) for a in after.held_by_band.values())
    unattributed = after.unattributed.get(variant, 0) if isinstance(after, KubernetesAvailability) else 0
    assert after.amounts[variant] == max(0, total - held - unattributed)
    if target.exclusive:  # nothing else runs there: exact numbers
        assert after.amounts[variant] == before.amounts[variant] - 2
    assert backend.cancel(spec.job_id)
    held_before = before.held_by_band.get(Band.BATCH, {}).get(variant, 0)
    wait_for(  # the next scenario counts from a quiet backend
        lambda: backend.describe().availability.held_by_band.get(Band.BATCH, {}).get(variant, 0) == held_before,
        "the cancelled job's GPUs to be released",
    )


def test_an_unchanged_report_keeps_its_observation_epoch(target, backend):
    """The epoch names the numbers: a heartbeat repeating them is the same observation (a parent that
    resets reservations on a newer one is not invited to spend them again)."""
    if not target.exclusive:
        pytest.skip("on a shared cluster the numbers may change between two reports")
    first = backend.describe().availability
    backend.clock = lambda: first.observation_epoch_ms + 60_000  # a minute later, nothing changed
    again = backend.describe().availability
    assert again == first


def test_the_heartbeat_counts_admitted_pods_per_band_and_ignores_gated_and_finished_ones(target, backend):
    if not target.kubernetes:
        pytest.skip(
            "pods made outside the backend exist only on Kubernetes: the process backend runs nothing it did not "
            "start (its per-band count is the scenario above and tests/backends/test_process_backend.py)"
        )
    before = backend.describe().availability
    assert isinstance(before, KubernetesAvailability)
    api = core(target)
    names = {
        "gated": _pod(target, 2, "sleep 300", priority_class=target.priority_classes.get(Band.BATCH), gated=True),
        "admitted": _pod(target, 2, "sleep 300", priority_class=target.priority_classes.get(Band.BATCH)),
        "finished": _pod(target, 1, "true", priority_class=target.priority_classes.get(Band.BATCH)),
        "no-class": _pod(target, 1, "sleep 300", priority_class=None),
    }
    try:
        wait_for(
            lambda: api.read_namespaced_pod(names["finished"], target.namespace).status.phase == "Succeeded",
            "the finished pod to succeed",
        )
        variant = target.variant

        def settled() -> KubernetesAvailability | None:
            now = backend.describe().availability
            assert isinstance(now, KubernetesAvailability)
            batch = now.held_by_band.get(Band.BATCH, {}).get(variant, 0)
            grew = batch - before.held_by_band.get(Band.BATCH, {}).get(variant, 0)
            unattributed = now.unattributed.get(variant, 0) - before.unattributed.get(variant, 0)
            return now if (grew, unattributed) == (2, 1) else None

        after = wait_for(settled, "the admitted pods to be counted")
        assert after.observation_epoch_ms >= before.observation_epoch_ms
        total, held = after.total_amounts[variant], sum(a.get(variant, 0) for a in after.held_by_band.values())
        assert after.amounts[variant] == max(0, total - held - after.unattributed.get(variant, 0))
        assert {"band": UNATTRIBUTED_BAND, "amounts": {variant: after.unattributed[variant]}} in after.to_wire()[
            "held_by_band"
        ]
        if target.kind == "kube":  # the control plane here is ours alone: exact numbers
            assert (after.total_amounts, after.amounts) == ({"h100": 8}, {"h100": 5})
            assert backend.capacity().left_out_nodes == {
                "h100-cordoned": "unschedulable (cordoned)",
                "h100-maintenance": "taint maintenance=true:NoExecute not tolerated",
            }
            described = backend.describe()
            assert described.advertised["device-variant"] == ("h100",) and described.kind == "kubernetes"
            assert described.advertised["region"] == ("test",)
    finally:
        for name in names.values():
            api.delete_namespaced_pod(name, target.namespace, grace_period_seconds=0)


def test_delivering_twice_with_one_nonce_creates_one_job(target, backend):
    peer = AgentlessPeer("cw-k8s", [backend], allowed_submitters=["*"])
    spec = job(target, "sleep 300")
    handoff = Handoff(spec.job_id, uuid.uuid4().hex, spec, "default", "marin", "alice", "alice", 1_000)
    first = peer.deliver(handoff)
    second = peer.deliver(handoff)
    assert first.nonce == second.nonce == handoff.nonce
    assert first.state in (JobState.PENDING, JobState.ACCEPTED, JobState.RUNNING)
    replay = backend.submit(submission(spec, handoff.nonce))
    assert replay.replay
    assert target.incarnations(spec.job_id) == [target.object_name(spec.job_id)]
    # Another incarnation while this one lives: refused for good, as the seed's ALREADY_EXISTS.
    with pytest.raises(PeerError) as refused:
        peer.deliver(Handoff(spec.job_id, uuid.uuid4().hex, spec, "default", "marin", "alice", "alice", 2_000))
    assert refused.value.code is PeerErrorCode.ALREADY_EXISTS and refused.value.terminal
    with pytest.raises(AlreadyExistsError, match="still running here as another incarnation"):
        backend.submit(submission(spec))


def test_a_job_runs_to_success_with_its_files_env_and_logs(target, backend):
    spec = job(
        target,
        'cat data/greeting.txt; echo "replica $IRIS_REPLICA_INDEX of $IRIS_NUM_REPLICAS on $IRIS_DEVICE_VARIANT $TEAM"'
        "; echo out > written.txt",
        replicas=2,
        files={"data/greeting.txt": "hello from the workdir\n"},
        env={"TEAM": "ml"},
    )
    outcome = backend.submit(submission(spec))
    assert not outcome.replay and outcome.report.job_id == spec.job_id
    report = wait_state(backend, spec.job_id, JobState.SUCCEEDED)
    assert (report.exit_code, report.error, report.backend_id) == (0, "", "default")
    assert [(r.index, r.state, r.exit_code) for r in report.replicas] == [
        (0, JobState.SUCCEEDED, 0),
        (1, JobState.SUCCEEDED, 0),
    ]
    assert report.started_at_ms is not None and report.finished_at_ms >= report.started_at_ms
    chunk = backend.logs(spec.job_id)
    assert chunk.lines == (
        "[replica 0] hello from the workdir",
        f"[replica 0] replica 0 of 2 on {target.variant} ml",
        "[replica 1] hello from the workdir",
        f"[replica 1] replica 1 of 2 on {target.variant} ml",
    )
    assert backend.logs(spec.job_id, chunk.next_cursor).lines == ()
    limited = backend.logs(spec.job_id, max_lines=3)
    assert limited.truncated and len(limited.lines) == 3
    assert backend.logs(spec.job_id, limited.next_cursor).lines == chunk.lines[3:]
    # A finished job is replaced by the next incarnation.
    rerun = backend.submit(submission(spec))
    assert not rerun.replay and rerun.report.nonce != report.nonce
    assert wait_state(backend, spec.job_id, JobState.SUCCEEDED).nonce == rerun.report.nonce


def token(expires_in_s: int) -> str:
    """A job token as the backend sees one: a JWT it never verifies (the job API does)."""
    return jwt.encode({"sub": "job", "exp": int(time.time()) + expires_in_s}, "k" * 32, algorithm="HS256")


def test_a_jobs_token_is_a_file_the_backend_renews_while_it_runs(target, backend):
    """The job reads its token from $IRIS_JOB_TOKEN_FILE, and the backend rewrites that file for the
    live incarnation (a renewed token reaches a running job) and for no other. On Kubernetes the file
    is a Secret of the incarnation's: the token is nowhere in the Job, which anyone who may read Jobs
    reads, and one listing tells which tokens are half spent."""
    first, renewed = token(900), token(1800)
    spec = job(
        target,
        'first=$(cat "$IRIS_JOB_TOKEN_FILE"); echo "$first";'
        ' while [ "$(cat "$IRIS_JOB_TOKEN_FILE")" = "$first" ]; do sleep 0.1; done; cat "$IRIS_JOB_TOKEN_FILE"; echo',
    )
    sub = Submission(
        spec.job_id,
        uuid.uuid4().hex,
        spec,
        "marin",
        int(time.time() * 1000),
        job_env={"IRIS_FEDERATION_URL": "http://127.0.0.1:9", "IRIS_JOB_TOKEN": first},
    )
    backend.submit(sub)
    wait_for(lambda: backend.logs(spec.job_id).lines == (f"[replica 0] {first}",), "the job to read its first token")
    live = [(spec.job_id, sub.nonce)]
    if target.kubernetes:
        first_expiry = jwt.decode(first, options={"verify_signature": False})["exp"]
        assert backend.job_tokens_due(live, lambda expires: expires == first_expiry) == set(live)
        assert backend.job_tokens_due(live, lambda expires: False) == set()
        assert backend.job_tokens_due([(spec.job_id, "another-nonce")], lambda expires: True) == set()
        [made] = (
            client.BatchV1Api(target.admin)
            .list_namespaced_job(target.namespace, label_selector=f"{JOB_KEY_LABEL}={job_key(spec.job_id)}")
            .items
        )
        assert first not in json.dumps(client.ApiClient().sanitize_for_serialization(made))
    assert not backend.write_job_token(spec.job_id, "another-nonce", renewed)
    assert backend.write_job_token(spec.job_id, sub.nonce, renewed)
    wait_state(backend, spec.job_id, JobState.SUCCEEDED)
    assert backend.logs(spec.job_id).lines == (f"[replica 0] {first}", f"[replica 0] {renewed}")


def test_a_jobs_named_port_is_reached_where_the_backend_says_while_it_runs(target, backend):
    """What the serving proxy asks a backend: where replica 0 listens on a named port, for the
    incarnation running now, and nothing once it has stopped. On Kubernetes that is replica 0's pod
    IP and the port's containerPort (the command node's pods run on loopback)."""
    spec = job(
        target,
        'exec python3 -m http.server "$IRIS_PORT_HTTP" --bind 127.0.0.1',
        ports=[{"name": "http"}],
        files={"hello.txt": "served from the job\n"},
    )
    sub = submission(spec)
    backend.submit(sub)

    def answer() -> str | None:
        served = backend.served_port(spec.job_id, "http")
        if served is None:
            return None
        assert served.nonce == sub.nonce
        try:
            return httpx.get(f"http://{served.host}:{served.port}/hello.txt", timeout=5).text
        except httpx.TransportError:  # listening soon
            return None

    assert wait_for(answer, "the job to serve its port where the backend says") == "served from the job\n"
    assert backend.served_port(spec.job_id, "metrics") is None  # a port the job did not declare
    assert backend.cancel(spec.job_id)
    wait_for(lambda: backend.served_port(spec.job_id, "http") is None, "nothing served once the job stopped")


def test_a_job_hands_back_the_json_replica_0_wrote_at_iris_result(target, backend):
    """Every replica writes a result; the job hands back replica 0's, its output stays free of it,
    and the next incarnation of the job never shows it."""
    spec = job(
        target,
        'echo "writing $IRIS_REPLICA_INDEX"'
        """; printf '{"replica": %s,\\n "loss": 0.25, "path": "s3://ckpt/a b"}\\n' "$IRIS_REPLICA_INDEX" """
        '> "$IRIS_RESULT"',
        replicas=2,
    )
    backend.submit(submission(spec))
    report = wait_state(backend, spec.job_id, JobState.SUCCEEDED)
    assert report.result is not None
    assert json.loads(report.result) == {"replica": 0, "loss": 0.25, "path": "s3://ckpt/a b"}
    assert backend.status(spec.job_id).result == report.result  # read again: the same
    assert backend.logs(spec.job_id).lines == ("[replica 0] writing 0", "[replica 1] writing 1")
    # The next incarnation writes nothing: it hands nothing back, not the previous one's result.
    silent = job(target, "echo quiet", gpus=1)
    rerun = backend.submit(submission(parse_job({**silent.model_dump(mode="json"), "job_id": spec.job_id})))
    done = wait_state(backend, spec.job_id, JobState.SUCCEEDED)
    assert done.nonce == rerun.report.nonce and done.result is None


@pytest.mark.parametrize(
    ("writes", "message"),
    [
        ('printf \'{"loss": 0.25,\' > "$IRIS_RESULT"', "is not valid JSON: Expecting property name"),
        (
            "{ printf '\"'; head -c 1048600 /dev/zero | tr '\\000' a; printf '\"'; } > \"$IRIS_RESULT\"",
            "at most 1048576 bytes (1 MiB) are handed back",
        ),
    ],
    ids=["malformed", "oversize"],
)
def test_a_result_that_cannot_be_handed_back_fails_the_job_saying_why(target, backend, writes, message):
    spec = job(target, f"echo trained; {writes}")
    backend.submit(submission(spec))
    report = wait_state(backend, spec.job_id, JobState.FAILED)
    assert report.error.startswith("The job's result (the file at $IRIS_RESULT)") and message in report.error
    assert report.result is None
    assert backend.logs(spec.job_id).lines == ("[replica 0] trained",)


def test_a_failing_job_is_mirrored_with_its_exit_code(target, backend):
    spec = job(target, "echo bad input; exit 7")
    backend.submit(submission(spec))
    report = wait_state(backend, spec.job_id, JobState.FAILED)
    assert report.exit_code == 7
    assert [(r.index, r.state, r.exit_code) for r in report.replicas] == [(0, JobState.FAILED, 7)]
    if target.kubernetes:  # Kubernetes adds the Job's own failure condition after the replica's
        assert report.error.startswith("Replica 0 exited with code 7; Job failed: BackoffLimitExceeded")
    else:
        assert report.error == "Replica 0 exited with code 7"
    assert backend.logs(spec.job_id).lines == ("[replica 0] bad input",)


def test_cancel_stops_the_job(target, backend):
    spec = job(target, "echo started; sleep 300")
    backend.submit(submission(spec))
    wait_state(backend, spec.job_id, JobState.RUNNING)
    if not target.kubernetes:
        wait_for(lambda: backend.logs(spec.job_id).lines, "the job's first line")
    assert backend.cancel(spec.job_id) is True
    assert backend.cancel("/alice/never-submitted") is False
    if not target.kubernetes:
        # The process backend keeps a cancelled job's record (its state, error and output stay
        # readable, as a finished Kubernetes Job's do); cancelling it again is a no-op on a known job.
        report = wait_state(backend, spec.job_id, JobState.KILLED)
        assert report.error == "Cancelled"
        assert backend.logs(spec.job_id).lines == ("[replica 0] started",)
        assert backend.cancel(spec.job_id) is True
        assert backend.live_job_ids() == []
        return
    # Kubernetes deletes a running Job (foreground): the Job and its pods go, and the backend forgets it.
    wait_for(lambda: backend.status(spec.job_id) is None, "the Job to be deleted")
    pods = core(target).list_namespaced_pod(target.namespace, label_selector=f"{JOB_KEY_LABEL}={job_key(spec.job_id)}")
    assert pods.items == []
    assert backend.cancel(spec.job_id) is False


def test_jobs_the_cluster_can_never_run_are_refused_with_the_reason(target, backend):
    # The reasons are each backend's own words: a cluster of nodes, or one machine's slots.
    wrong_variant = "has no a100 GPUs; it has" if target.kubernetes else r"cannot ever host 1 x 1 a100: it has"
    too_many = "no node has more than" if target.kubernetes else r"cannot ever host 1 x 256 h100"
    a100, huge = _spec(target, "a100", 1), _spec(target, target.variant, 256)  # the most a replica may ask
    with pytest.raises(SubmissionRefusedError, match=wrong_variant) as refused:
        backend.submit(submission(a100))
    assert not isinstance(refused.value, InsufficientCapacityError)  # a wrong shape: no cluster size helps
    with pytest.raises(InsufficientCapacityError, match=too_many):  # too small: a larger cluster may take it
        backend.submit(submission(huge))
    assert backend.status(a100.job_id) is None and backend.status(huge.job_id) is None  # nothing was made
    if not target.kubernetes:
        return  # workdir files go to the process backend's disk: only Kubernetes objects are bounded (1 MiB)
    too_big = {"blob.bin": "x" * 1_000_001}
    with pytest.raises(SubmissionRefusedError, match="bytes of workdir files; backend default passes at most 1000000"):
        backend.submit(submission(job(target, "true", files=too_big)))


def test_a_workdir_bundle_is_unpacked_for_the_job_or_refused_for_another_cluster_to_take(target, backend, tmp_path):
    """The backend puts a job's bundle from its cluster's bundle store into the job's workdir: the
    process backend unpacks it there; a Kubernetes backend uploads it to its ``bundle_store`` (the
    GCS emulator here) and its pod's init container fetches and checks it. A Kubernetes backend with
    no bundle store refuses the job as too big for it, which sends a handoff back to the parent's
    queue."""
    data = b"weights " * 1000
    entries = [BundleEntry("data/weights.txt", len(data), False, lambda: [data])]
    store = getattr(backend, "bundles", None) or BundleStore(tmp_path / "bundles")
    ref = store.pack(entries)
    spec = job(target, "wc -c data/weights.txt", bundle=ref.model_dump())
    if target.kubernetes:
        storeless = target.backend(bundle_store=False)
        with pytest.raises(InsufficientCapacityError, match=f"carries a workdir bundle of {ref.size} bytes; backend"):
            storeless.submit(submission(spec))
        assert storeless.status(spec.job_id) is None
        with pytest.raises(PeerError) as refused:  # driven as an agentless peer: requeued, not killed
            AgentlessPeer("cw-k8s", [storeless], allowed_submitters=["*"]).deliver(
                Handoff(spec.job_id, "n1", spec, storeless.backend_id, "marin", "alice", "alice", 1)
            )
        assert refused.value.code is PeerErrorCode.RESOURCE_EXHAUSTED and refused.value.requeues
        if target.bundle_store is None:
            return  # your cluster, or no GCS emulator: no bundle store to test against
    backend.submit(submission(spec))
    assert wait_state(backend, spec.job_id, JobState.SUCCEEDED).exit_code == 0
    assert backend.logs(spec.job_id).lines == (f"[replica 0] {len(data)} data/weights.txt",)


def test_a_200_mib_workdir_bundle_reaches_the_job(target, backend, tmp_path):
    """Issue 15's size: a 200 MiB workdir, packed into the cluster's store, reaches the job whole
    (through the GCS bundle store and the init container on Kubernetes), and the job reads it."""
    if target.kubernetes and target.bundle_store is None:
        pytest.skip("no bundle store here: your cluster, or the GCS emulator is not built (scripts/gcs-emulator.sh)")
    chunk = os.urandom(1 << 20)  # incompressible, cheap: 200 distinct 1 MiB blocks
    blocks = [chunk[i:] + chunk[:i] for i in range(200)]
    digest = hashlib.sha256(b"".join(blocks)).hexdigest()
    entries = [BundleEntry("data/shard.bin", 200 << 20, False, lambda: iter(blocks))]
    ref = (getattr(backend, "bundles", None) or BundleStore(tmp_path / "bundles")).pack(entries)
    spec = job(target, "sha256sum data/shard.bin", bundle=ref.model_dump())

    backend.submit(submission(spec))

    assert wait_state(backend, spec.job_id, JobState.SUCCEEDED).exit_code == 0
    assert backend.logs(spec.job_id).lines == (f"[replica 0] {digest}  data/shard.bin",)


def test_a_bundle_changed_in_the_bucket_fails_the_job_before_it_runs(target, backend):
    """The pod checks the digest it was submitted with: an object replaced in the bucket is never
    unpacked, and the job's error says which container stopped it and why."""
    if not target.kubernetes or target.bundle_store is None:
        pytest.skip("the bundle store's own check: Kubernetes with a bundle store only")
    data = b"honest weights\n"
    ref = backend.bundles.pack([BundleEntry("weights.txt", len(data), False, lambda: [data])])
    tampered = backend.bundles.pack([BundleEntry("weights.txt", 15, False, lambda: [b"forged weights\n"])])
    backend.bundle_store.put(ref.digest, backend.bundles.path(tampered))  # the bucket now holds other bytes
    spec = job(target, "cat weights.txt", bundle=ref.model_dump())

    backend.submit(submission(spec))

    failed = wait_state(backend, spec.job_id, JobState.FAILED)
    assert "its init container bundle exited with code 2" in failed.error
    assert "not the one submitted (digest mismatch)" in failed.error
    assert backend.logs(spec.job_id).lines == ()  # the job's command never ran


def test_a_peer_full_of_batch_work_still_takes_an_interactive_job(target, backend):
    if not target.exclusive:
        pytest.skip("fills the variant's GPUs: set IRIS_K8S_EXCLUSIVE=1 on a cluster this test may fill")
    size, count = target.gpu_shape(backend)
    batch = [job(target, "echo batch; sleep 300", gpus=size, band="batch") for _ in range(count)]
    for spec in batch:
        backend.submit(submission(spec))
    for spec in batch:
        wait_state(backend, spec.job_id, JobState.RUNNING)
    peer = AgentlessPeer("cw-k8s", [backend], allowed_submitters=["*"])
    heartbeat = peer.heartbeat()
    availability = heartbeat[0].availability
    assert availability is not None and availability.amounts[target.variant] == 0
    assert availability.held_by_band[Band.BATCH][target.variant] == size * count

    interactive = job(target, "echo interactive ran; sleep 2", gpus=size, band="interactive")
    now = int(time.time() * 1000)
    placed = plan(
        [Candidate.from_job(interactive, now)], [PeerState("cw-k8s", True, now, tuple(heartbeat))], now_ms=now
    )
    [promotion] = placed.promotions
    assert (promotion.peer_id, promotion.backend_id, promotion.preempts) == ("cw-k8s", "default", True)
    # A batch job does not get to reclaim batch work: it waits.
    more_batch = job(target, "true", gpus=size, band="batch")
    assert (
        plan(
            [Candidate.from_job(more_batch, now)], [PeerState("cw-k8s", True, now, tuple(heartbeat))], now_ms=now
        ).promotions
        == ()
    )

    report = peer.deliver(
        Handoff(interactive.job_id, uuid.uuid4().hex, interactive, "default", "marin", "alice", "alice", now)
    )
    assert report.state in (JobState.PENDING, JobState.ACCEPTED)
    if target.kind == "cluster" and not target.queue_name:
        pytest.skip("the rest needs Kueue to preempt batch work: give the real cluster's local queue name")
    # Kueue (or the process backend's own band eviction) preempts batch work for it: a batch job goes
    # back to the queue while the interactive one runs.
    seen: set[JobState] = set()

    def interactive_done() -> JobReport | None:
        seen.update(backend.status(spec.job_id).state for spec in batch)
        done = backend.status(interactive.job_id)
        return done if done is not None and done.state.terminal else None

    finished = wait_for(interactive_done, "the interactive job to run")
    assert (finished.state, finished.exit_code) == (JobState.SUCCEEDED, 0)
    assert JobState.PENDING in seen
    assert backend.logs(interactive.job_id).lines == ("[replica 0] interactive ran",)


# A plain TCP rendezvous, as torch.distributed's store does it (torch itself is too heavy for CI):
# replica 0 listens on MASTER_PORT, every other replica connects to MASTER_ADDR, and they swap ranks.
RENDEZVOUS = """\
import os, socket, time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
assert os.environ["IRIS_COORDINATOR_ADDRESS"] == f"{host}:{port}", os.environ["IRIS_COORDINATOR_ADDRESS"]
assert os.environ["NODE_RANK"] == os.environ["IRIS_REPLICA_INDEX"] == str(rank)
assert os.environ["IRIS_NUM_REPLICAS"] == str(world)
if rank == 0:
    met = []
    with socket.create_server(("", port)) as server:
        server.settimeout(50)
        for _ in range(world - 1):
            connection, _ = server.accept()
            with connection:
                met.append(int(connection.makefile().readline()))
                connection.sendall(b"0\\n")
    print(f"rank 0 of {world} met ranks {sorted(met)}", flush=True)
else:
    deadline = time.monotonic() + 50
    while True:  # replica 0 may not listen yet (and on a cluster, its name may not resolve yet)
        try:
            connection = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with connection:
        connection.sendall(f"{rank}\\n".encode())
        peer = connection.makefile().readline().strip()
    print(f"rank {rank} of {world} met rank {peer}", flush=True)
"""


def test_two_replicas_rendezvous_through_the_coordinator_address(target, backend):
    """A multi-node job's replicas meet: replica 0 listens where every replica is told it is. On the
    process backend that is a port of loopback found free for the run; on Kubernetes it is replica 0's
    stable hostname under the Job's headless Service (the command node here resolves it to loopback:
    no cluster DNS), and Kueue admits the two pods as one workload. The image needs Python."""
    spec = job(target, "python3 rendezvous.py", replicas=2, files={"rendezvous.py": RENDEZVOUS}, image="python:3.12")
    delivered = submission(spec)
    submitted = backend.submit(delivered)
    assert backend.submit(delivered).replay  # a replay makes nothing twice (on Kubernetes, one Service)
    report = wait_state(backend, spec.job_id, JobState.SUCCEEDED, JobState.FAILED)
    lines = backend.logs(spec.job_id).lines
    assert (report.state, report.error) == (JobState.SUCCEEDED, ""), lines
    assert [(r.index, r.state, r.exit_code) for r in report.replicas] == [
        (0, JobState.SUCCEEDED, 0),
        (1, JobState.SUCCEEDED, 0),
    ]
    assert lines == ("[replica 0] rank 0 of 2 met ranks [1]", "[replica 1] rank 1 of 2 met rank 0")
    if not target.kubernetes:
        return
    # The names behind it: one headless Service owned by the Job, selecting this incarnation's pods,
    # which the pods name as their subdomain, each pod under its stable hostname.
    name, nonce = job_name(spec.job_id), submitted.report.nonce
    the_job = client.BatchV1Api(target.admin).read_namespaced_job(name, target.namespace)
    services = core(target).list_namespaced_service(
        target.namespace, label_selector=f"{JOB_KEY_LABEL}={job_key(spec.job_id)}"
    )
    [service] = services.items
    assert service.metadata.name == rendezvous_service_name(name, nonce)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    assert service.spec.selector == {JOB_KEY_LABEL: job_key(spec.job_id), NONCE_LABEL: nonce}
    assert [(o.kind, o.name, o.uid) for o in service.metadata.owner_references] == [("Job", name, the_job.metadata.uid)]
    pods = core(target).list_namespaced_pod(target.namespace, label_selector=f"{JOB_KEY_LABEL}={job_key(spec.job_id)}")
    by_index = {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p for p in pods.items}
    assert sorted(by_index) == [0, 1]
    assert [(by_index[i].spec.hostname, by_index[i].spec.subdomain) for i in (0, 1)] == [
        (f"{name}-0", service.metadata.name),
        (f"{name}-1", service.metadata.name),
    ]
    env = {e.name: e.value for e in by_index[1].spec.containers[0].env if e.value is not None}
    coordinator = f"{name}-0.{service.metadata.name}"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"]) == (
        coordinator,
        str(target.coordinator_port),
        "2",
    )
    assert env["IRIS_COORDINATOR_ADDRESS"] == f"{coordinator}:{target.coordinator_port}"
    if target.queue_name:  # Kueue admitted the Job as one gang: one Workload of both pods
        workloads = client.CustomObjectsApi(target.admin).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", target.namespace, "workloads"
        )
        ours = [
            w
            for w in workloads["items"]
            if any(o["uid"] == the_job.metadata.uid for o in w["metadata"].get("ownerReferences", []))
        ]
        assert len(ours) == 1, [w["metadata"]["name"] for w in ours]
        [workload] = ours
        assert [p["count"] for p in workload["spec"]["podSets"]] == [2]
        assert [a["count"] for a in workload["status"]["admission"]["podSetAssignments"]] == [2]
        conditions = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
        assert conditions.get("Admitted") == "True" and conditions.get("Finished") == "True", conditions
    # The Service goes with its Job (garbage-collected through its owner reference).
    client.BatchV1Api(target.admin).delete_namespaced_job(name, target.namespace, propagation_policy="Background")
    wait_for(
        lambda: (
            not core(target).list_namespaced_service(target.namespace, label_selector=f"{NONCE_LABEL}={nonce}").items
        ),
        "the rendezvous Service to be garbage-collected with its Job",
    )


def _spec(target: Target, variant: str, gpus: int) -> JobSpec:
    return parse_job(
        {
            "job_id": f"/alice/contract-{uuid.uuid4().hex[:8]}",
            "command": "true",
            "resources": {"device": {"type": "gpu", "variant": variant, "count": gpus}},
        }
    )


def _pod(target: Target, gpus: int, command: str, *, priority_class: str | None, gated: bool = False) -> str:
    name = f"contract-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": target.image,
                "command": ["sh", "-c", command],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if target.node_selector():
        spec["nodeSelector"] = target.node_selector()
    if priority_class:
        spec["priorityClassName"] = priority_class
    if gated:
        spec["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    core(target).create_namespaced_pod(
        target.namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    )
    return name

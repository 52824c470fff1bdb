"""The live demo: a federating Airflow on this machine, jobs submitted through its REST API.

It starts Airflow (api-server, scheduler, dag-processor, triggerer as separate processes) for the
parent cluster ``marin`` (a CPU process backend) with two GPU peers driven directly
(``cw-h100``: 8 h100 slots; ``cw-gb200``: 4 gb200 slots), triggers the example DAG
``federated_job`` once per example job as different users, and prints where each job landed and
why the waiting ones wait, until they are done. Then it keeps Airflow up for you to explore the
UI, and stops everything cleanly on Ctrl-C (``--exit-when-done`` stops at once instead).

With ``--with-airflow-peer`` it also starts a second Airflow deployment, ``cw-east`` (8 h200
slots), as a real peer: marin reaches it over its peer HTTP API with signed identity, and one more
example job needs h200s, so it is handed off there.

Every example job has the outcome the README shows (where it runs, and that it succeeds or is
rejected); with ``--exit-when-done`` the demo exits with status 1 naming each job that ended
otherwise, so CI runs it (``scripts/test.sh``) and a regression cannot pass silently.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from devtools.airflow_deployment import REPO, AirflowDeployment, DeploymentError

# (user, title, job, (expected state, expected place: a prefix of "peer cw-h100/default", "marin/cpu", "-")).
EXAMPLE_JOBS: list[tuple[str, str, dict[str, Any], tuple[str, str]]] = [
    (
        "alice",
        "8 x H100 training: the only peer with H100s has them free",
        {
            "command": "echo training on GPUs $CUDA_VISIBLE_DEVICES; sleep 12; echo done",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}},
            "priority_band": "interactive",
        },
        ("succeeded", "peer cw-h100"),
    ),
    (
        "bob",
        "4 x GB200 fine-tune: lands on the GB200 peer, flagged there for its gs:// prefix (cw-gb200 reads s3://)",
        {
            "command": "echo fine-tuning from $MARIN_PREFIX; sleep 6",
            "env": {"MARIN_PREFIX": "gs://marin-us-central2/checkpoints"},
            "resources": {"device": {"type": "gpu", "variant": "gb200", "count": 4}},
            "priority_band": "batch",
        },
        ("succeeded", "peer cw-gb200"),
    ),
    (
        "alice",
        "another 8 x H100 job: waits for the first one's GPUs",
        {
            "command": "echo second training run; sleep 3",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}},
            "priority_band": "batch",
        },
        ("succeeded", "peer cw-h100"),
    ),
    (
        "bob",
        "CPU preprocessing: runs here, on marin",
        {"command": "echo tokenizing; sleep 2", "resources": {"device": {"type": "cpu"}}},
        ("succeeded", "marin/cpu"),
    ),
    (
        "alice",
        "CPU evaluation pinned to cw-gb200 (target_cluster)",
        {"command": "echo evaluating", "target_cluster": "cw-gb200"},
        ("succeeded", "peer cw-gb200"),
    ),
    (
        "bob",
        "TPU v5p job: nobody has TPUs, so it is rejected at once",
        {"command": "true", "resources": {"device": {"type": "tpu", "variant": "v5p-8", "count": 4}}},
        ("rejected", "-"),
    ),
]


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("no free port")


PEER_JOB = (
    "alice",
    "8 x H200 job: only cw-east, a second Airflow deployment, has H200s; it goes over HTTP",
    {
        "command": "echo running on the peer deployment; sleep 4",
        "resources": {"device": {"type": "gpu", "variant": "h200", "count": 8}},
    },
    ("succeeded", "peer cw-east"),
)

SERVED_APP = Path(__file__).with_name("served_app.py")
SERVING_JOB = (
    "alice",
    "a streaming chat server on cw-east, reached through marin's URL (see below)",
    {
        "command": [sys.executable, "served_app.py"],
        "files": {"served_app.py": SERVED_APP.read_text()},
        "ports": [{"name": "http"}],
        "env": {"SERVING_LIFETIME_S": "600"},
        "target_cluster": "cw-east",
    },
    ("succeeded", "peer cw-east"),
)
CHAT_REQUEST = '{"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=REPO / ".demo", help="where the demo keeps everything")
    parser.add_argument("--port", type=int, default=8080, help="api-server port (another free one if taken)")
    parser.add_argument("--exit-when-done", action="store_true", help="stop as soon as every job has finished")
    parser.add_argument(
        "--with-airflow-peer",
        action="store_true",
        help="also start a second Airflow deployment, cw-east (8 h200), as a real peer reached over HTTP",
    )
    args = parser.parse_args(argv)
    args.home = args.home.resolve()  # SQLite URLs need an absolute path

    shutil.rmtree(args.home, ignore_errors=True)
    args.home.mkdir(parents=True)
    cluster = args.home / "cluster.yaml"
    config = yaml.safe_load((REPO / "examples" / "cluster-demo.yaml").read_text())
    config["state_dir"] = str(args.home / "marin" / "iris")  # where the process backends keep their jobs
    deployments = []
    peer_deployment = None
    port = free_port(args.port)
    if args.with_airflow_peer:
        peer_deployment, peer_entry = airflow_peer(args.home, config, f"http://127.0.0.1:{port}")
        config["peers"].append(peer_entry)
        deployments.append(peer_deployment)
    cluster.write_text(yaml.safe_dump(config, sort_keys=False))
    deployment = AirflowDeployment(
        home=args.home / "marin",
        port=port,
        metadata_url=f"sqlite:///{args.home / 'marin' / 'airflow.db'}",
        store_url=f"sqlite:///{args.home / 'marin' / 'iris_federation.db'}",
        cluster_config=cluster,
        passwords={"admin": "admin"},
        fast_failure_detection=False,
    )
    deployments.append(deployment)
    jobs = EXAMPLE_JOBS + ([PEER_JOB, SERVING_JOB] if peer_deployment else [])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    failed = False
    try:
        started = time.monotonic()
        if peer_deployment is not None:
            say(f"Starting the peer deployment cw-east in {peer_deployment.home} ...")
            peer_deployment.start()
            peer_deployment.wait_for_dag("iris_federation_runner")
            say(f"  cw-east is up: {peer_deployment.base_url} (admin / admin)")
        say(f"Starting Airflow for marin in {deployment.home} (logs in {deployment.home / 'logs'}) ...")
        deployment.start()
        deployment.wait_for_dag("federated_job")
        deployment.wait_for_dag("iris_federation_tick")
        elapsed = time.monotonic() - started
        say(f"Airflow is up after {elapsed:.0f} s: {deployment.base_url} (user admin, password admin)")
        runs = []
        for user, title, job, _expected in jobs:
            run_id = deployment.trigger("federated_job", {"job": job}, user=user)
            runs.append((user, title, run_id))
            say(f"  {user:<6} submitted {title}")
            time.sleep(1)
        if peer_deployment is not None:
            show_serving(deployment, runs[-1][2])
        ended = watch(deployment, runs)
        unexpected = surprises(jobs, ended)
        if unexpected:
            say("\nThese jobs did not end as the demo expects:\n" + "\n".join(unexpected))
            say(f"Logs: {deployment.home / 'logs'}" + (f", {peer_deployment.home / 'logs'}" if peer_deployment else ""))
            failed = True
        say(f"\nAll jobs are done. Airflow UI: {deployment.base_url}/dags/federated_job (admin / admin)")
        if peer_deployment is not None:
            say(f"The peer's view of the job it received: {peer_deployment.base_url}/dags/iris_federation_runner")
        say("Each task's log shows the pending reasons it went through; its XCom says where the job ran.")
        if not args.exit_when_done:
            say("Press Ctrl-C to stop.")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except DeploymentError as error:
        say(f"\nThe demo failed: {error}")
        return 1
    finally:
        say("Stopping Airflow ...")
        for running in reversed(deployments):
            running.stop()
        stop_jobs(cluster)
        if peer_deployment is not None and peer_deployment.cluster_config is not None:
            stop_jobs(peer_deployment.cluster_config)
        say("Stopped.")
    return 1 if failed else 0


def surprises(
    jobs: list[tuple[str, str, dict[str, Any], tuple[str, str]]], ended: list[tuple[str, str, str]]
) -> list[str]:
    """Each job that did not end as expected (its state, where it ran, and its DAG run's state,
    which must agree with the job's): its title, and what it did instead."""
    found = []
    for (_user, title, _job, (state, place)), (got_state, got_place, run_state) in zip(jobs, ended, strict=True):
        run_expected = "success" if state == "succeeded" else "failed"
        if got_state != state or not got_place.startswith(place) or run_state != run_expected:
            found.append(
                f"  {title}: expected {state} at {place} (run {run_expected}), "
                f"got {got_state} at {got_place} (run {run_state})"
            )
    return found


def airflow_peer(
    home: Path, parent_config: dict[str, Any], parent_url: str
) -> tuple[AirflowDeployment, dict[str, Any]]:
    """A second deployment, cw-east, that trusts marin's key and accepts alice's and bob's jobs; the
    serving URLs it mints go through marin (``public_parent``), signed with its own secret."""
    import secrets

    from iris_airflow_provider.peers.identity import generate_keypair

    keys = home / "keys"
    keys.mkdir()
    for name in ("marin", "cw-east"):
        private, public = generate_keypair()
        (keys / f"{name}.key").write_text(private)
        (keys / f"{name}.pub").write_text(public)
    parent_config["federation"] = {"private_key": str(keys / "marin.key")}
    peer_home = home / "cw-east"
    peer_home.mkdir()
    peer_cluster = peer_home / "cluster.yaml"
    peer_cluster.write_text(
        yaml.safe_dump(
            {
                "name": "cw-east",
                "state_dir": str(peer_home / "iris"),
                "placement": {"sync_interval_seconds": 3},
                "federation": {
                    "private_key": str(keys / "cw-east.key"),
                    "trusted_peers": {"marin": {"public_key": str(keys / "marin.pub")}},
                    "allowed_submitters": ["alice", "bob"],
                    "public_parent": parent_url,
                },
                "serving": {"token_secret": secrets.token_urlsafe(32)},
                "backends": [{"id": "default", "kind": "process", "devices": {"h200": 8}}],
            },
            sort_keys=False,
        )
    )
    peer = AirflowDeployment(
        home=peer_home,
        port=free_port(8081),
        metadata_url=f"sqlite:///{peer_home / 'airflow.db'}",
        store_url=f"sqlite:///{peer_home / 'iris_federation.db'}",
        cluster_config=peer_cluster,
        passwords={"admin": "admin"},
        fast_failure_detection=False,
    )
    # Plain HTTP on loopback: the demo has no TLS certificate (a real peer is reached over https).
    return peer, {"id": "cw-east", "kind": "airflow", "url": peer.base_url, "allow_insecure_http": True}


def watch(deployment: AirflowDeployment, runs: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Print each job's state, where it runs and why it waits, whenever anything changes, until
    every run has ended; then each job's final (state, place, DAG run state)."""
    from iris_airflow_provider.store.store import FederationStore

    store = FederationStore.from_url(deployment.store_url)
    last = ""
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            lines, done, ended = [], 0, []
            for user, title, run_id in runs:
                run_state = deployment.run("federated_job", run_id)["state"]
                job = next((j for j in store.list_jobs(limit=1000) if j.origin and j.origin.run_id == run_id), None)
                if job is None:
                    where, state = "-", "rejected" if run_state == "failed" else "submitting"
                    detail = ""
                else:
                    where = (
                        f"peer {job.peer_id}" if job.peer_id else ("marin" if job.direction.value == "local" else "-")
                    )
                    if job.backend_id:
                        where += f"/{job.backend_id}"
                    state = job.state.value
                    detail = job.pending_reason or job.error
                if run_state in ("success", "failed"):
                    done += 1
                ended.append((state, where, run_state))
                lines.append(
                    f"  {user:<6} {state:<13} {where:<22} {title}" + (f"\n{'':>23}-> {detail}" if detail else "")
                )
            table = "\n".join(lines)
            if table != last:
                say(f"\n[{time.strftime('%H:%M:%S')}] job states (DAG run state in the UI):\n{table}")
                last = table
            if done == len(runs):
                return ended
            time.sleep(1)
        raise DeploymentError("the example jobs did not finish within 5 minutes")
    finally:
        store.dispose()


def show_serving(parent: AirflowDeployment, run_id: str) -> None:
    """Wait for the serving job marin handed to cw-east to listen, print its URL as marin's user finds
    it (the task's XCom on marin: the URL cw-east minted, through marin's relay, which marin checked),
    stream a chat completion through it with curl, then end the job."""
    import httpx

    deadline = time.monotonic() + 180
    url = ""
    while not url and time.monotonic() < deadline:
        time.sleep(1)
        try:
            urls = parent.xcom("federated_job", run_id, "run", "serving_urls")
            url = str(urls["http"]) if httpx.get(urls["http"] + "ready", timeout=30).status_code == 200 else ""
        except (httpx.HTTPError, KeyError, TypeError):
            continue
    if not url:
        raise DeploymentError("the serving job on cw-east did not answer through marin within 3 minutes")
    say(f"\nThe chat server runs on cw-east; marin's task shows the URL cw-east minted, through marin:\n  {url}")
    command = ["curl", "-sN", f"{url}v1/chat/completions", "-H", "Content-Type: application/json", "-d", CHAT_REQUEST]
    say("$ " + " ".join(f"'{part}'" if " " in part or "{" in part else part for part in command))
    if shutil.which("curl"):
        subprocess.run(command, check=False, timeout=60)
    else:  # the same request without curl
        with httpx.stream("POST", f"{url}v1/chat/completions", content=CHAT_REQUEST, timeout=60) as answer:
            for line in answer.iter_lines():
                say(line)
    httpx.post(f"{url}shutdown", timeout=30)  # the job ends, and succeeds


def stop_jobs(cluster: Path) -> None:
    """Jobs run detached (they survive Airflow restarts by design); the demo does not leave any behind."""
    from iris_airflow_provider.cluster.build import build_local_backends, build_peers
    from iris_airflow_provider.cluster.config import load_cluster_config

    config = load_cluster_config(cluster)
    backends = list(build_local_backends(config).values())
    for peer in build_peers(config).values():
        backends.extend(getattr(peer, "backends", {}).values())
    for backend in backends:
        for job_id in getattr(backend, "live_job_ids", list)():
            backend.cancel(job_id)


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())

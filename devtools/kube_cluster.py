"""A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK (nodes and pods without a kubelet) and Kueue with
its webhooks, from the binaries ``scripts/kube-binaries.sh`` builds. No Airflow import.

    bin_dir = find_binaries()                 # None when they were never built
    with KubeCluster(tmp_path, bin_dir) as kube:
        kube.create_node("gpu-1", gpus=8)     # a KWOK node: its pods run nothing
        kube.create_command_node("gpu-2", gpus=8)  # its pods run their command (kube_command_node)
        api = kube.admin_client()             # a kubernetes ApiClient in system:masters

Every process listens on 127.0.0.1 only, logs to ``<directory>/logs/<name>.log``, and is stopped
by its pid. One throwaway CA (``kube_pki``) signs every certificate. Kueue and KWOK run with the
admin identity; the controller manager and scheduler with their own (the RBAC they get by default).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from devtools import kube_kueue
from devtools.kube_pki import Pki

REPO = Path(__file__).resolve().parents[1]
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kueue", "kwok")
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")  # the nodes KWOK manages
# KWOK's own stages: nodes become Ready and hold a lease; pods go Running, and Job pods Succeeded.
# Each folder's kustomization.yaml lists its stages.
KWOK_STAGES = ("node/fast", "node/heartbeat-with-lease", "pod/general")


def find_binaries() -> Path | None:
    """The bin directory with every binary, from ``IRIS_KUBE_BIN`` or the build script's cache."""
    if os.environ.get("IRIS_KUBE_BIN"):
        path = Path(os.environ["IRIS_KUBE_BIN"])
        return path if all((path / b).exists() for b in BINARIES) else None
    try:  # --check only locates a complete build, it never builds
        out = subprocess.run(
            ["bash", str(REPO / "scripts/kube-binaries.sh"), "--check"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KubeCluster:
    def __init__(self, directory: Path, bin_dir: Path, *, start_timeout: float = 120) -> None:
        self.directory = Path(directory)
        self.bin = Path(bin_dir)
        self.share = self.bin.parent  # kueue/ and kwok/ manifests copied beside bin/ by the build
        self.start_timeout = start_timeout
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = {
            name: free_port()
            for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok", "kueue-webhook", "kueue-health")
        }
        self.url = f"https://127.0.0.1:{self.ports['apiserver']}"

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._make_credentials()
        self._start_etcd()
        self._start_apiserver()
        self._install_kueue_manifests()
        self._start_controllers()
        self._start_kwok()
        self._start_kueue()

    def stop(self) -> None:
        """Stop each process by its pid, newest first (Kueue before the API server it serves)."""
        for name, process in reversed(list(self.processes.items())):
            _terminate(process)
            self.processes.pop(name)

    def _spawn(self, name: str, args: list[str], *, cwd: Path | None = None) -> None:
        """Start ``args`` (a binary of ``bin_dir`` when not an absolute path), logging to ``log(name)``."""
        logs = self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        program = args[0] if os.path.isabs(args[0]) else str(self.bin / args[0])
        with (logs / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [program, *args[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd or self.directory,
                start_new_session=True,
            )

    def _wait(self, name: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.log(name)}")
            try:
                if check():
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not healthy after {self.start_timeout:g} s; see {self.log(name)}")
            time.sleep(0.25)

    def log(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    def _healthy(self, url: str, *, client_cert: bool = True) -> bool:
        context = ssl.create_default_context(cafile=self.pki.ca_path) if url.startswith("https") else None
        if context is not None and client_cert:
            context.load_cert_chain(*self.admin_cert)
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return bool(response.status == 200)

    # --- credentials -------------------------------------------------------------------------

    def _make_credentials(self) -> None:
        self.pki = Pki(self.directory / "pki")
        self.apiserver_cert = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ips=["127.0.0.1", "10.0.0.1"],
            server=True,
        )
        self.admin_cert = self.pki.issue("admin", "iris-admin", organization="system:masters")
        self.sa_key, self.sa_pub = self.pki.key_pair("service-account")
        self.kubeconfigs = {"admin": self._kubeconfig("admin", self.admin_cert)}
        for who in ("kube-controller-manager", "kube-scheduler"):
            self.kubeconfigs[who] = self._kubeconfig(who, self.pki.issue(who, f"system:{who}"))
        self.serving = {
            who: self.pki.issue(f"{who}-serving", who, dns=["localhost"], ips=["127.0.0.1"], server=True)
            for who in ("kube-controller-manager", "kube-scheduler", "kwok")
        }
        # Kueue's webhook cert: the name its rotator checks, and the address the API server dials.
        self.kueue_cert = self.pki.issue(
            "kueue-webhook",
            f"{kube_kueue.SERVICE}.{kube_kueue.NAMESPACE}.svc",
            dns=[f"{kube_kueue.SERVICE}.{kube_kueue.NAMESPACE}.svc"],
            ips=["127.0.0.1"],
            server=True,
        )

    def _kubeconfig(self, name: str, cert: tuple[Path, Path]) -> Path:
        path = self.directory / f"{name}.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": name,
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca_path)},
                        }
                    ],
                    "users": [{"name": name, "user": {"client-certificate": str(cert[0]), "client-key": str(cert[1])}}],
                    "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
                }
            )
        )
        return path

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfigs["admin"]

    def admin_client(self) -> Any:
        """A ``kubernetes`` ApiClient with every permission, for a test's own setup and checks."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.admin_kubeconfig))

    # --- components ----------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.ports['etcd']}", f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--name=default",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",  # throwaway data: skip fsync, the disk is shared with other tests
            ],
        )
        self._wait("etcd", lambda: self._healthy(f"{client}/health"))

    def _start_apiserver(self) -> None:
        cert, key = self.apiserver_cert
        self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                f"--client-ca-file={self.pki.ca_path}",
                f"--cert-dir={self.directory / 'apiserver-certs'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                # The apiserver would publish 127.0.0.1 as the endpoint of service "kubernetes", which
                # endpoint validation rejects; no pod here dials it.
                "--endpoint-reconciler-type=none",
                # KWOK answers the kubelet API (logs) on the node's address, 127.0.0.1.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={self.admin_cert[0]}",
                f"--kubelet-client-key={self.admin_cert[1]}",
                # Trust for a front proxy nobody runs; without it every client of the delegated
                # authentication (controllers, scheduler, Kueue) logs a missing CA bundle forever.
                f"--requestheader-client-ca-file={self.pki.ca_path}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--profiling=false",
            ],
        )
        self._wait("kube-apiserver", lambda: self._healthy(f"{self.url}/readyz"))

    def _start_controllers(self) -> None:
        for name, port, extra in (
            (
                "kube-controller-manager",
                self.ports["kcm"],
                [
                    # Each controller acts as its own service account, with the bootstrap RBAC roles.
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={self.sa_key}",
                    f"--root-ca-file={self.pki.ca_path}",
                ],
            ),
            ("kube-scheduler", self.ports["scheduler"], []),
        ):
            kubeconfig = self.kubeconfigs[name]
            cert, key = self.serving[name]
            self._spawn(
                name,
                [
                    name,
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    f"--tls-cert-file={cert}",
                    f"--tls-private-key-file={key}",
                    *extra,
                ],
            )
        for name, port in (("kube-controller-manager", self.ports["kcm"]), ("kube-scheduler", self.ports["scheduler"])):
            url = f"https://127.0.0.1:{port}/healthz"
            self._wait(name, functools.partial(self._healthy, url, client_cert=False))

    def _start_kwok(self) -> None:
        stages = self.directory / "kwok.yaml"
        docs = []
        for folder in KWOK_STAGES:
            path = self.share / "kwok/stage" / folder
            docs += [
                (path / name).read_text()
                for name in yaml.safe_load((path / "kustomization.yaml").read_text())["resources"]
            ]
        stages.write_text("\n---\n".join(docs))
        cert, key = self.serving["kwok"]
        port = self.ports["kwok"]
        self._spawn(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={'='.join(KWOK_ANNOTATION)}",
                "--cidr=10.244.0.1/16",
                "--node-ip=127.0.0.1",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                "--node-lease-duration-seconds=40",
            ],
        )
        self._wait("kwok", lambda: self._healthy(f"https://127.0.0.1:{port}/healthz", client_cert=False))

    def create_node(
        self,
        name: str,
        *,
        gpus: int = 0,
        tpus: int = 0,
        cpu: str = "32",
        memory: str = "256Gi",
        labels: Mapping[str, str] | None = None,
        unschedulable: bool = False,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """A node KWOK keeps Ready, with ``gpus`` ``nvidia.com/gpu`` (and ``tpus`` ``google.com/tpu``,
        if any) allocatable. Its pods run no command: KWOK marks them running (and a Job's pods
        succeeded at once)."""
        from kubernetes import client

        resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
        if tpus:
            resources["google.com/tpu"] = str(tpus)
        spec: dict[str, Any] = {"unschedulable": unschedulable}
        if taints:
            spec["taints"] = [dict(t) for t in taints]
        with self.admin_client() as api:
            client.CoreV1Api(api).create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": dict([KWOK_ANNOTATION]),
                        "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
                    },
                    "spec": spec,
                    "status": {"allocatable": resources, "capacity": resources},
                }
            )
        self._wait_node_ready(name)

    def create_command_node(
        self, name: str, *, gpus: int = 0, tpus: int = 0, labels: Mapping[str, str] | None = None
    ) -> None:
        """A node whose pods really run their command (``kube_command_node``): for tests that need a
        job's output, files, environment and exit code. Stopped with the cluster or ``delete_node``."""
        port = free_port()
        cert, key = self.pki.issue(f"node-{name}", f"system:node:{name}", dns=[name], ips=["127.0.0.1"], server=True)
        ready = self.directory / f"node-{name}.ready"
        args = [
            sys.executable,
            "-m",
            "devtools.kube_command_node",
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--node={name}",
            f"--gpus={gpus}",
            f"--tpus={tpus}",
            f"--port={port}",
            f"--tls-cert={cert}",
            f"--tls-key={key}",
            f"--directory={self.directory / 'nodes' / name}",
            f"--ready-file={ready}",
            *(f"--label={key}={value}" for key, value in (labels or {}).items()),
        ]
        self._spawn(f"node-{name}", args, cwd=REPO)
        self._wait(f"node-{name}", ready.exists)
        self._wait_node_ready(name)

    def _wait_node_ready(self, name: str) -> None:
        """Until the node is Ready and the controller manager has lifted the ``not-ready`` taint the
        API server puts on every new node: before that it takes no pods and counts for nothing."""
        from kubernetes import client

        def ready() -> bool:
            with self.admin_client() as api:
                node = client.CoreV1Api(api).read_node(name)
            conditions = {c.type: c.status for c in node.status.conditions or []}
            condition_taints = [
                t.key
                for t in node.spec.taints or []
                if t.key.startswith("node.kubernetes.io/") and t.key != "node.kubernetes.io/unschedulable"
            ]
            return conditions.get("Ready") == "True" and not condition_taints

        self._wait(f"node-{name}" if f"node-{name}" in self.processes else "kwok", ready)

    def delete_node(self, name: str) -> None:
        """Delete a node (and stop its command runner, if it has one). Its pods are left to the pod
        garbage collector, as when a node goes away."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        process = self.processes.pop(f"node-{name}", None)
        if process is not None:
            _terminate(process)
        with self.admin_client() as api:
            try:
                client.CoreV1Api(api).delete_node(name)
            except ApiException as error:
                if error.status != 404:
                    raise

    # --- Kueue ---------------------------------------------------------------------------------

    def _install_kueue_manifests(self) -> None:
        cert, key = self.kueue_cert
        # The secret Kueue's rotator reads: ours, so it keeps a cert valid for 127.0.0.1.
        secret = {"ca.crt": self.pki.ca_path, "ca.key": self.pki.ca_key_path, "tls.crt": cert, "tls.key": key}
        with self.admin_client() as api:
            kube_kueue.install(
                api,
                self.share / "kueue",
                f"https://127.0.0.1:{self.ports['kueue-webhook']}",
                self.pki.ca_path.read_bytes(),
                {name: path.read_bytes() for name, path in secret.items()},
                self.start_timeout,
            )

    def _start_kueue(self) -> None:
        certs = self.directory / "kueue-certs"
        certs.mkdir(exist_ok=True)
        # In a pod the secret is mounted here; the rotator waits for the files to appear.
        for src, dst in zip(self.kueue_cert, ("tls.crt", "tls.key"), strict=True):
            (certs / dst).write_bytes(src.read_bytes())
        config = self.directory / "kueue.yaml"
        ports = {"health_port": self.ports["kueue-health"], "webhook_port": self.ports["kueue-webhook"]}
        config.write_text(yaml.safe_dump(kube_kueue.configuration(**ports, cert_dir=certs)))
        # Its on-demand visibility API would listen on every interface; the tests don't use it.
        args = [
            "kueue",
            f"--config={config}",
            f"--kubeconfig={self.admin_kubeconfig}",
            "--feature-gates=VisibilityOnDemand=false",
        ]
        self._spawn("kueue", args)
        health = f"http://127.0.0.1:{self.ports['kueue-health']}/readyz"
        self._wait("kueue", lambda: self._healthy(health))

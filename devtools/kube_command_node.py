"""A node of the real control plane whose pods really run their command: the one part of a cluster
that cannot run here (no container runtime, so no kubelet). KWOK plays every other node; a test
that needs a job's real output, files, environment and exit code gets its pods scheduled here.

Being the kubelet of one Node, it:
- registers the Node (Ready, ``nvidia.com/gpu`` allocatable, the given labels) and renews its Lease;
- for each pod the scheduler binds to it: waits for its ConfigMap and Secret volumes (as
  ``ContainerCreating``), mounts them and its emptyDirs into the pod's directory, resolves its env
  (values, field refs, ConfigMap and Secret keys; a path under a mount is moved into the pod's
  directory, where the mount is; a name of a pod of the pod's ``subdomain`` becomes 127.0.0.1, see
  below), runs each container's ``command + args`` there
  as a local process (the image is ignored) and publishes the pod's status: Running, then
  Succeeded or Failed with each container's exit code;
- refreshes a running pod's Secret and ConfigMap volumes mounted whole (not by ``subPath``) when
  the object changes, as a kubelet does (every second here, not every minute or so);
- serves each container's output on the kubelet's log endpoint, which the API server proxies for
  ``pods/log`` (with ``timestamps``, ``sinceSeconds``, ``sinceTime``, ``tailLines``, ``limitBytes``);
- stops a pod being deleted (SIGTERM to its process group, SIGKILL after the grace period) and
  then removes it, as a kubelet does.

    python -m devtools.kube_command_node --kubeconfig admin.kubeconfig --node h100-a --gpus 8 \\
        --label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 --port 10250 --tls-cert c --tls-key k \\
        --directory /tmp/h100-a --ready-file /tmp/h100-a.ready

There is no cluster DNS here: an env value naming a pod of the pod's own ``subdomain`` (the headless
Service of a multi-replica Job: ``<pod hostname>.<subdomain>``, also with ``.<namespace>.svc`` and
``.cluster.local``, and an optional ``:port``) is rewritten to 127.0.0.1 (with that port) before the
command starts, which is what that name would resolve to if every pod of the subdomain ran here as
this node's processes. So replicas meet as on a cluster through ``MASTER_ADDR`` and
``IRIS_COORDINATOR_ADDRESS``, only on loopback (only replica 0 listens, so they do not collide on a
port); a name inside a longer value, or resolved by the program itself from elsewhere, is not
rewritten, and a pod of the subdomain running on another (KWOK) node would not be reached.

Not shipped in the package; no Airflow import.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import os
import re
import signal
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

POLL_SECONDS = 0.2
VOLUME_SYNC_SECONDS = 1.0  # a kubelet takes up to a minute or so; tests should not wait that long
LEASE_SECONDS = 40  # what KWOK's nodes use: the controller manager's grace period is longer
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
FINISHED = ("Succeeded", "Failed")


def rfc3339(ns: int, *, nanos: bool = False) -> str:
    stamp = datetime.datetime.fromtimestamp(ns // 1_000_000_000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ns % 1_000_000_000:09d}Z" if nanos else stamp + "Z"


def micro_time(ns: int) -> str:
    """A Lease's ``MicroTime``: RFC 3339 with microseconds."""
    return rfc3339(ns, nanos=True)[:-4] + "Z"


@dataclass
class Container:
    name: str
    lines: list[tuple[int, bytes]] = field(default_factory=list)  # (ns since the epoch, one line)
    process: subprocess.Popen[bytes] | None = None
    started_at: int = 0
    finished_at: int = 0
    exit_code: int | None = None
    failure: str = ""  # why it could not start


@dataclass
class PodRun:
    namespace: str
    name: str
    uid: str
    containers: dict[str, Container] = field(default_factory=dict)
    init_containers: dict[str, Container] = field(default_factory=dict)  # run one by one, first
    initialized: bool = False
    started_at: int = 0
    done: bool = False
    term_sent_at: float | None = None
    volumes_synced_at: float = 0.0  # monotonic: when its Secret and ConfigMap volumes were last refreshed


class CommandNode:
    def __init__(self, api: Any, node: str, directory: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        self.node = node
        self.directory = directory
        self.lock = threading.Lock()
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.waiting: dict[str, str] = {}  # pod uid -> the reason last published
        self.stopping = threading.Event()

    # --- the Node ------------------------------------------------------------------------------

    def register(self, gpus: int, labels: Mapping[str, str], port: int, tpus: int = 0) -> None:
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        if tpus:
            resources["google.com/tpu"] = str(tpus)
        self.core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node, **labels}},
            }
        )
        now = rfc3339(time.time_ns())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "devtools.kube_command_node runs this node's pods",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.core.patch_node_status(
            self.node,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [ready],
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": self.node},
                    ],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "kubeletVersion": "v0.0.0-command-node",
                        "kubeProxyVersion": "",
                        "bootID": "",
                        "containerRuntimeVersion": "local-process://0",
                        "kernelVersion": "",
                        "machineID": "",
                        "osImage": "",
                        "systemUUID": "",
                    },
                }
            },
        )

    def renew_lease(self) -> None:
        node = self.core.read_node(self.node)
        body = {
            "metadata": {
                "name": self.node,
                "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid}],
            },
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": micro_time(time.time_ns()),
            },
        }
        try:
            self.leases.patch_namespaced_lease(self.node, "kube-node-lease", body)
        except ApiException as error:
            if error.status != 404:
                raise
            self.leases.create_namespaced_lease("kube-node-lease", body)

    # --- pods ----------------------------------------------------------------------------------

    def sync(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        for pod in pods:
            uid = pod.metadata.uid
            run = self.runs.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                self._stop(pod, run)
            elif run is None and (pod.status.phase or "Pending") not in FINISHED:
                missing = self._missing_volume(pod)
                if missing:
                    self._wait(pod, "ContainerCreating", f"MountVolume.SetUp failed: {missing} not found")
                else:
                    self._start(pod)
            elif run is not None and not run.done and time.monotonic() - run.volumes_synced_at >= VOLUME_SYNC_SECONDS:
                run.volumes_synced_at = time.monotonic()
                with contextlib.suppress(ApiException, OSError):  # gone meanwhile: the next sync sees it
                    self._refresh_volumes(pod, self.directory / "pods" / uid)
        present = {pod.metadata.uid for pod in pods}
        with self.lock:
            for uid in [uid for uid, run in self.runs.items() if uid not in present and run.done]:
                del self.runs[uid]

    def _stop(self, pod: Any, run: PodRun | None) -> None:
        if run is not None and not run.done:
            grace = pod.metadata.deletion_grace_period_seconds or 0
            if run.term_sent_at is None:
                run.term_sent_at = time.monotonic()
                _signal(run, signal.SIGTERM)
            elif time.monotonic() - run.term_sent_at >= grace:
                _signal(run, signal.SIGKILL)
            return
        # Everything stopped: the kubelet's last word removes the pod (this one, by uid).
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": pod.metadata.uid}},
            )

    def _missing_volume(self, pod: Any) -> str:
        for volume in pod.spec.volumes or []:
            config_map, secret = volume.config_map, volume.secret
            if (
                config_map
                and not config_map.optional
                and not self._exists(self.core.read_namespaced_config_map, config_map.name, pod)
            ):
                return f'configmap "{config_map.name}"'
            if (
                secret
                and not secret.optional
                and not self._exists(self.core.read_namespaced_secret, secret.secret_name, pod)
            ):
                return f'secret "{secret.secret_name}"'
        return ""

    @staticmethod
    def _exists(read: Any, name: str, pod: Any) -> bool:
        try:
            read(name, pod.metadata.namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def _wait(self, pod: Any, reason: str, message: str) -> None:
        if self.waiting.get(pod.metadata.uid) == message:
            return
        self.waiting[pod.metadata.uid] = message
        statuses = [
            {
                "name": c.name,
                "image": c.image or "",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            for c in pod.spec.containers
        ]
        self._patch_status(pod.metadata.namespace, pod.metadata.name, {"containerStatuses": statuses})

    def _start(self, pod: Any) -> None:
        run = PodRun(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, started_at=time.time_ns())
        with self.lock:
            self.runs[run.uid] = run
        self.waiting.pop(run.uid, None)
        threading.Thread(target=self._run_pod, args=(run, pod), name=f"pod {run.name}", daemon=True).start()

    def _run_pod(self, run: PodRun, pod: Any) -> None:
        rootfs = self.directory / "pods" / run.uid
        try:
            self._mount(pod, rootfs)
        except (OSError, KeyError) as error:
            failure = f"CreateContainerError: {error}"
            for spec in pod.spec.containers:
                run.containers[spec.name] = Container(spec.name, exit_code=128, failure=failure)
        else:
            if not self._initialize(run, pod, rootfs):
                return
            for spec in pod.spec.containers:
                run.containers[spec.name] = self._launch(pod, spec, rootfs)
        self._publish(run, pod, "Running")
        threads = [
            threading.Thread(target=self._collect, args=(run, container), daemon=True)
            for container in run.containers.values()
            if container.process is not None
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        run.done = True
        codes = [c.exit_code for c in run.containers.values()]
        if run.term_sent_at is None:  # a pod being deleted is removed, not finished
            self._publish(run, pod, "Succeeded" if all(code == 0 for code in codes) else "Failed")

    def _initialize(self, run: PodRun, pod: Any, rootfs: Path) -> bool:
        """Runs the pod's init containers one at a time, each to its end, as a kubelet does; the
        first that fails (or cannot start) fails the pod and its containers never run."""
        for spec in pod.spec.init_containers or []:
            container = run.init_containers[spec.name] = self._launch(pod, spec, rootfs)
            self._publish(run, pod, "Pending")
            if container.process is not None:
                self._collect(run, container)
            if container.exit_code != 0 or run.term_sent_at is not None:
                run.done = True
                if run.term_sent_at is None:
                    self._publish(run, pod, "Failed")
                return False
        run.initialized = True
        return True

    def _launch(self, pod: Any, spec: Any, rootfs: Path) -> Container:
        container = Container(spec.name)
        argv = [*(spec.command or []), *(spec.args or [])]
        if not argv:
            container.exit_code, container.failure = 128, "the container names no command (images are not run here)"
            return container
        cwd = rootfs / (spec.working_dir or "/").lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
        try:
            container.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=_subdomain_on_loopback(_in_rootfs(self._env(pod, spec), spec, rootfs), pod),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach its children too
            )
        except OSError as error:
            container.exit_code, container.failure = 128, f"StartError: cannot run {argv[0]}: {error}"
            return container
        container.started_at = time.time_ns()
        return container

    def _collect(self, run: PodRun, container: Container) -> None:
        process = container.process
        assert process is not None
        assert process.stdout is not None
        for raw in process.stdout:
            with self.lock:
                container.lines.append((time.time_ns(), raw.rstrip(b"\n")))
        code = process.wait()
        container.exit_code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number
        container.finished_at = time.time_ns()

    def _publish(self, run: PodRun, pod: Any, phase: str) -> None:
        statuses = self._statuses(pod.spec.containers, run.containers, phase)
        if any(c.failure for c in run.containers.values()):
            phase = "Pending" if phase == "Running" else phase
        ready = "True" if statuses and all(s["ready"] for s in statuses) else "False"
        now = rfc3339(time.time_ns())
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",  # its processes listen on this machine's loopback
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": rfc3339(run.started_at),
            "containerStatuses": statuses,
            "conditions": [
                {"type": kind, "status": value, "lastTransitionTime": now}
                for kind, value in (
                    ("Initialized", "True" if run.initialized else "False"),
                    ("ContainersReady", ready),
                    ("Ready", ready),
                )
            ],
        }
        if pod.spec.init_containers:
            status["initContainerStatuses"] = self._statuses(pod.spec.init_containers, run.init_containers, phase)
        self._patch_status(run.namespace, run.name, status, uid=run.uid)

    def _statuses(self, specs: list[Any], containers: Mapping[str, Container], phase: str) -> list[dict[str, Any]]:
        """Each container's status; one not launched yet is waiting (``PodInitializing``)."""
        statuses = []
        for spec in specs:
            container = containers.get(spec.name)
            if container is None:
                waiting = {"waiting": {"reason": "PodInitializing"}}
                statuses.append(
                    {
                        "name": spec.name,
                        "image": spec.image or "",
                        "imageID": "",
                        "restartCount": 0,
                        "ready": False,
                        "started": False,
                        "state": waiting,
                    }
                )
                continue
            entry: dict[str, Any] = {
                "name": spec.name,
                "image": spec.image or "",
                "imageID": "",
                "restartCount": 0,
                "ready": phase == "Running" and container.exit_code is None,
                "started": container.exit_code is None,
            }
            if container.failure:
                reason = container.failure.split(":", 1)[0]
                entry["state"] = {"waiting": {"reason": reason, "message": container.failure}}
                entry["started"] = False
            elif container.exit_code is None:
                entry["state"] = {"running": {"startedAt": rfc3339(container.started_at)}}
            else:
                entry["state"] = {
                    "terminated": {
                        "exitCode": container.exit_code,
                        "reason": "Completed" if container.exit_code == 0 else "Error",
                        "startedAt": rfc3339(container.started_at),
                        "finishedAt": rfc3339(container.finished_at),
                    }
                }
            statuses.append(entry)
        return statuses

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any], *, uid: str = "") -> None:
        body: dict[str, Any] = {"status": status}
        if uid:
            body["metadata"] = {"uid": uid}  # a pod of the same name that replaced it is not touched
        with contextlib.suppress(ApiException):  # gone, or replaced: nothing to report on
            self.core.patch_namespaced_pod_status(name, namespace, body)

    # --- volumes and env -----------------------------------------------------------------------

    def _mount(self, pod: Any, rootfs: Path) -> None:
        volumes = {v.name: v for v in pod.spec.volumes or []}
        for spec in [*(pod.spec.init_containers or []), *pod.spec.containers]:
            for mount in sorted(spec.volume_mounts or [], key=lambda m: len(m.mount_path)):
                target = rootfs / mount.mount_path.lstrip("/")
                files = self._volume_files(volumes[mount.name], pod.metadata.namespace)
                if files is None:  # emptyDir and the like: a directory
                    target.mkdir(parents=True, exist_ok=True)
                elif mount.sub_path:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(files[mount.sub_path])
                    if mount.read_only:
                        target.chmod(0o444)
                else:
                    for path, content in files.items():
                        (target / path).parent.mkdir(parents=True, exist_ok=True)
                        (target / path).write_bytes(content)

    def _refresh_volumes(self, pod: Any, rootfs: Path) -> None:
        """Carry a Secret's or ConfigMap's new content into a running pod's files, as a kubelet does
        for a volume mounted whole (never one mounted by ``subPath``): each changed file replaced at
        once, so a reader sees the old content or the new, never half of one."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        for spec in pod.spec.containers:
            for mount in spec.volume_mounts or []:
                volume = volumes[mount.name]
                if mount.sub_path or (volume.secret is None and volume.config_map is None):
                    continue
                target = rootfs / mount.mount_path.lstrip("/")
                for path, content in (self._volume_files(volume, pod.metadata.namespace) or {}).items():
                    file = target / path
                    if file.exists() and file.read_bytes() == content:
                        continue
                    file.parent.mkdir(parents=True, exist_ok=True)
                    staged = file.with_name(f".{file.name}.new")
                    staged.write_bytes(content)
                    os.replace(staged, file)

    def _volume_files(self, volume: Any, namespace: str) -> dict[str, bytes] | None:
        if volume.config_map is not None:
            source = volume.config_map
            obj = self.core.read_namespaced_config_map(source.name, namespace)
            data = {k: v.encode() for k, v in (obj.data or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        elif volume.secret is not None:
            source = volume.secret
            obj = self.core.read_namespaced_secret(source.secret_name, namespace)
            data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        else:
            return None
        if source.items:
            return {item.path: data[item.key] for item in source.items if item.key in data}
        return data

    def _env(self, pod: Any, spec: Any) -> dict[str, str]:
        env = {key: os.environ[key] for key in BASE_ENV if key in os.environ}
        env["HOSTNAME"] = pod.spec.hostname or pod.metadata.name
        namespace = pod.metadata.namespace
        for entry in spec.env or []:
            if entry.value_from is None:
                env[entry.name] = entry.value or ""
            elif entry.value_from.field_ref is not None:
                env[entry.name] = _field(pod, entry.value_from.field_ref.field_path)
            elif entry.value_from.config_map_key_ref is not None:
                ref = entry.value_from.config_map_key_ref
                data = self.core.read_namespaced_config_map(ref.name, namespace).data or {}
                env[entry.name] = data.get(ref.key, "")
            elif entry.value_from.secret_key_ref is not None:
                ref = entry.value_from.secret_key_ref
                raw = (self.core.read_namespaced_secret(ref.name, namespace).data or {}).get(ref.key, "")
                env[entry.name] = base64.b64decode(raw).decode()
        return env

    # --- logs ----------------------------------------------------------------------------------

    def log(self, namespace: str, pod: str, container: str, query: Mapping[str, str]) -> tuple[int, bytes]:
        """What the kubelet answers for ``/containerLogs/<namespace>/<pod>/<container>``."""
        with self.lock:
            run = next((r for r in self.runs.values() if (r.namespace, r.name) == (namespace, pod)), None)
            state = (run.containers.get(container) or run.init_containers.get(container)) if run is not None else None
            if state is None or state.process is None:
                return 400, f'container "{container}" in pod "{pod}" is waiting to start'.encode()
            lines = list(state.lines)
        since = 0
        if query.get("sinceSeconds"):
            since = time.time_ns() - int(query["sinceSeconds"]) * 1_000_000_000
        if query.get("sinceTime"):
            parsed = datetime.datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
            since = max(since, int(parsed.timestamp()) * 1_000_000_000)
        lines = [(ns, line) for ns, line in lines if ns >= since]
        if query.get("tailLines"):
            lines = lines[-int(query["tailLines"]) :] if int(query["tailLines"]) else []
        stamped = query.get("timestamps") == "true"
        body = b"".join(
            (rfc3339(ns, nanos=True).encode() + b" " if stamped else b"") + line + b"\n" for ns, line in lines
        )
        if query.get("limitBytes"):
            body = body[: int(query["limitBytes"])]
        return 200, body

    def serve_logs(self, port: int, cert: Path, key: Path) -> ThreadingHTTPServer:
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if url.path == "/healthz":
                    status, body = 200, b"ok"
                elif len(parts) == 4 and parts[0] == "containerLogs":
                    query = dict(urllib.parse.parse_qsl(url.query))
                    status, body = node.log(parts[1], parts[2], parts[3], query)
                else:
                    status, body = 404, b"not found"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="kubelet API", daemon=True).start()
        return server

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        renewed = 0.0
        while not self.stopping.is_set():
            if time.monotonic() - renewed > LEASE_SECONDS / 4:
                self.renew_lease()
                renewed = time.monotonic()
            try:
                self.sync()
            except ApiException as error:  # the API server restarting, say: try again
                print(f"sync failed: {error.status} {error.reason}", flush=True)
            self.stopping.wait(POLL_SECONDS)

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            _signal(run, signal.SIGKILL)


def _signal(run: PodRun, sig: int) -> None:
    for container in [*run.init_containers.values(), *run.containers.values()]:
        if container.process is not None and container.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, sig)


def _in_rootfs(env: dict[str, str], spec: Any, rootfs: Path) -> dict[str, str]:
    """``env`` with absolute paths under one of the container's mounts moved into the pod's directory:
    with no mount namespace here, that is where the mount is (``IRIS_RESULT=/iris/result/...``)."""
    mounts = sorted((m.mount_path.rstrip("/") for m in spec.volume_mounts or []), key=len, reverse=True)
    moved = {}
    for name, value in env.items():
        mount = next((m for m in mounts if value == m or value.startswith(m + "/")), None)
        moved[name] = str(rootfs / value.lstrip("/")) if mount else value
    return moved


def _subdomain_on_loopback(env: dict[str, str], pod: Any) -> dict[str, str]:
    """``env`` with each value that names a pod of the pod's subdomain (``host.subdomain``, optionally
    ``.namespace.svc[.cluster.local]``, optionally ``:port``) as 127.0.0.1 (keeping the port): the
    address the name would have if those pods ran here, as this node runs them; no DNS serves it."""
    subdomain = pod.spec.subdomain
    if not subdomain:
        return env
    domain = rf"{re.escape(subdomain)}(\.{re.escape(pod.metadata.namespace)}(\.svc(\.cluster\.local)?)?)?"
    pod_name = re.compile(rf"[a-z0-9]([-a-z0-9]*[a-z0-9])?\.{domain}\.?(?P<port>:[0-9]+)?")
    rewritten = {}
    for name, value in env.items():
        match = pod_name.fullmatch(value)
        rewritten[name] = "127.0.0.1" + (match.group("port") or "") if match else value
    return rewritten


def _field(pod: Any, path: str) -> str:
    metadata = pod.metadata
    for prefix, source in (("metadata.annotations", metadata.annotations), ("metadata.labels", metadata.labels)):
        if path.startswith(prefix + "['"):
            return str((source or {}).get(path[len(prefix) + 2 : -2], ""))
    simple = {
        "metadata.name": metadata.name,
        "metadata.namespace": metadata.namespace,
        "metadata.uid": metadata.uid,
        "spec.nodeName": pod.spec.node_name or "",
        "spec.serviceAccountName": pod.spec.service_account_name or "default",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path, ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--tpus", type=int, default=0, help="google.com/tpu chips")
    parser.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    parser.add_argument("--port", type=int, required=True, help="the kubelet API (logs), on 127.0.0.1")
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--directory", type=Path, required=True, help="where pods' files and processes live")
    parser.add_argument("--ready-file", type=Path, required=True, help="written once the node is registered")
    args = parser.parse_args()
    api = config.new_client_from_config(config_file=args.kubeconfig)
    node = CommandNode(api, args.node, args.directory)
    server = node.serve_logs(args.port, args.tls_cert, args.tls_key)
    node.register(args.gpus, dict(label.split("=", 1) for label in args.label), args.port, args.tpus)
    node.renew_lease()
    args.ready_file.write_text("ready\n")
    signal.signal(signal.SIGTERM, lambda *_: node.stopping.set())
    try:
        node.run()
    finally:
        node.shutdown()
        server.shutdown()


if __name__ == "__main__":
    main()

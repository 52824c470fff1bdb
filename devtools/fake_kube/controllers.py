"""The fake cluster's controllers: a Kueue, the Job controller, a scheduler, a kubelet that really
runs each container's command as a local subprocess (the image is ignored), and the garbage collector.

- **Kueue**: queued Jobs (label ``kueue.x-k8s.io/queue-name``) are created suspended and queued
  plain pods get the ``kueue.x-k8s.io/admission`` gate. Pending workloads are admitted in priority
  order (the PriorityClass value), then creation order, while the ClusterQueue's quota allows (a
  workload that does not fit does not block smaller ones behind it): a Job is unsuspended, a pod's
  gate removed. A workload that does not fit may preempt admitted workloads of strictly lower
  priority in its ClusterQueue (lowest first, newest first): their Jobs are suspended, their pods
  deleted. Quota covers the resources the ClusterQueue names; others are not limited.
- **Jobs**: pods from the template (Indexed: one per completion index, with the index annotation,
  label and ``JOB_COMPLETION_INDEX``), ``backoffLimit`` failed pods fail the Job (and stop the
  rest), every index succeeding completes it; suspending stops the pods without counting failures.
- **Scheduler**: binds ungated pods to Ready, schedulable nodes whose taints they tolerate, whose
  labels match their node selector and required node affinity, with room for their requests.
- **Kubelet**: mounts ConfigMaps, Secrets and emptyDirs (a pod waits in ContainerCreating while a
  ConfigMap it needs is missing), resolves env (values, field refs, ConfigMap and Secret keys), runs
  ``command + args`` in the pod's directory, records timestamped output, exit codes and phases, and
  stops deleted pods (SIGTERM, then SIGKILL after the grace period).
- **Garbage collector**: dependents of a deleted owner go (background); foreground deletion keeps
  the owner until its dependents are gone.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import contextlib
import copy
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from devtools.fake_kube import semantics
from devtools.fake_kube.semantics import KUEUE_GATE, ApiError
from devtools.fake_kube.server import (
    QUEUE_LABEL,
    RESOURCES,
    FakeApiServer,
    now_rfc3339,
    now_rfc3339_nano,
    refresh_pod_conditions,
)

FINISHED = ("Succeeded", "Failed")
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


@dataclass
class ContainerRun:
    name: str
    process: asyncio.subprocess.Process | None = None
    lines: list[tuple[str, str]] = field(default_factory=list)
    exit_code: int | None = None
    started_at: str = ""
    finished_at: str = ""


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    done: bool = False
    term_sent_at: float | None = None


class Controllers:
    def __init__(self, server: FakeApiServer, root: Path) -> None:
        self.api = server
        self.store = server.store
        self.root = root
        kueue = server.config.get("kueue") or {}
        self.cluster_queues: dict[str, dict[str, Decimal]] = {
            name: {resource: semantics.quantity(value) for resource, value in quota.items()}
            for name, quota in (kueue.get("cluster_queues") or {}).items()
        }
        self.admitted: dict[str, dict[str, Any]] = {}  # workload (uid) -> cluster queue, usage, priority, when
        self.runs: dict[str, PodRun] = {}
        self.failed_creates: set[str] = set()
        server.log_reader = self.read_log

    async def run(self, interval: float = 0.05) -> None:
        while True:
            try:
                self.garbage_collect()
                self.kueue()
                self.jobs()
                self.schedule()
                self.kubelet()
            except Exception:  # a bug in one pass must not stop the cluster; it is reported
                traceback.print_exc(file=sys.stderr)
            await asyncio.sleep(interval)

    async def shutdown(self) -> None:
        for run in self.runs.values():
            for container in run.containers.values():
                if container.process is not None and container.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(container.process.pid, signal.SIGKILL)

    # Kueue ------------------------------------------------------------------------------------

    def _priority(self, pod_spec: dict[str, Any]) -> int:
        name = pod_spec.get("priorityClassName")
        if name:
            found = self.store.get("priorityclasses", "", name)
            return int(found["value"]) if found else 0
        return int(pod_spec.get("priority") or 0)

    def _workloads(self) -> list[tuple[str, dict[str, Any], str]]:
        """Every queued object: (plural, object, local queue)."""
        found = []
        for job in self.store.items("jobs"):
            queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if queue and not _job_finished(job) and not job["metadata"].get("deletionTimestamp"):
                found.append(("jobs", job, queue))
        for pod in self.store.items("pods"):
            queue = (pod["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            owned = any(r.get("kind") == "Job" for r in pod["metadata"].get("ownerReferences", []))
            finished = pod["status"].get("phase") in FINISHED or _deleting(pod)
            if queue and not owned and not finished:
                found.append(("pods", pod, queue))
        return found

    def kueue(self) -> None:
        workloads = self._workloads()
        alive = {obj["metadata"]["uid"] for _, obj, _ in workloads}
        for uid in list(self.admitted):
            if uid not in alive:
                del self.admitted[uid]  # finished or gone: its quota is free
        pending = []
        for plural, obj, queue in workloads:
            uid = obj["metadata"]["uid"]
            waiting = obj["spec"].get("suspend") if plural == "jobs" else _gated(obj)
            if uid in self.admitted and waiting:
                del self.admitted[uid]  # suspended again by someone else: evicted
            if uid not in self.admitted and waiting:
                pending.append((plural, obj, queue))
        pod_spec = lambda p, o: o["spec"]["template"]["spec"] if p == "jobs" else o["spec"]  # noqa: E731
        pending.sort(key=lambda w: (-self._priority(pod_spec(w[0], w[1])), w[1]["metadata"]["creationTimestamp"]))
        for plural, obj, queue in pending:
            cluster_queue = self.api.local_queues.get(f"{obj['metadata']['namespace']}/{queue}")
            if cluster_queue is None or cluster_queue not in self.cluster_queues:
                continue  # Kueue: the LocalQueue does not exist; the workload is inadmissible
            quota = self.cluster_queues[cluster_queue]
            spec = pod_spec(plural, obj)
            count = int(obj["spec"].get("parallelism", 1)) if plural == "jobs" else 1
            per_pod = semantics.pod_requests({"spec": spec})
            usage = {r: per_pod.get(r, Decimal(0)) * count for r in quota}
            priority = self._priority(spec)
            if not self._fits(cluster_queue, usage):
                victims = self._victims(cluster_queue, usage, priority)
                if victims is None:
                    continue
                for victim in victims:
                    self._evict(victim)
            self.admitted[obj["metadata"]["uid"]] = {
                "cq": cluster_queue,
                "usage": usage,
                "priority": priority,
                "at": time.monotonic(),
                "plural": plural,
                "key": (obj["metadata"]["namespace"], obj["metadata"]["name"]),
            }
            if plural == "jobs":
                obj["spec"]["suspend"] = False
                self.api.update_internal("jobs", obj)
            else:
                obj["spec"]["schedulingGates"] = [g for g in obj["spec"]["schedulingGates"] if g["name"] != KUEUE_GATE]
                if not obj["spec"]["schedulingGates"]:
                    del obj["spec"]["schedulingGates"]
                refresh_pod_conditions(obj)
                self.api.update_internal("pods", obj)

    def _used(self, cluster_queue: str, exclude: set[str] = frozenset()) -> dict[str, Decimal]:  # type: ignore[assignment]
        used: dict[str, Decimal] = {}
        for uid, entry in self.admitted.items():
            if entry["cq"] == cluster_queue and uid not in exclude:
                for resource, amount in entry["usage"].items():
                    used[resource] = used.get(resource, Decimal(0)) + amount
        return used

    def _fits(self, cluster_queue: str, usage: dict[str, Decimal], exclude: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        quota = self.cluster_queues[cluster_queue]
        used = self._used(cluster_queue, exclude)
        return all(used.get(r, Decimal(0)) + usage.get(r, Decimal(0)) <= quota[r] for r in quota)

    def _victims(self, cluster_queue: str, usage: dict[str, Decimal], priority: int) -> list[str] | None:
        candidates = sorted(
            (uid for uid, e in self.admitted.items() if e["cq"] == cluster_queue and e["priority"] < priority),
            key=lambda uid: (self.admitted[uid]["priority"], -self.admitted[uid]["at"]),
        )
        chosen: set[str] = set()
        for uid in candidates:
            if self._fits(cluster_queue, usage, chosen):
                break
            chosen.add(uid)
        return sorted(chosen) if self._fits(cluster_queue, usage, chosen) else None

    def _evict(self, uid: str) -> None:
        entry = self.admitted.pop(uid)
        namespace, name = entry["key"]
        obj = self.store.get(entry["plural"], namespace, name)
        if obj is None:
            return
        if entry["plural"] == "jobs":
            obj["spec"]["suspend"] = True  # the Job controller stops its pods; Kueue readmits it later
            self.api.update_internal("jobs", obj)
        else:
            self.api.delete(RESOURCES["pods"], obj, {}, {})

    # The Job controller -----------------------------------------------------------------------

    def jobs(self) -> None:
        for job in self.store.items("jobs"):
            if job["metadata"].get("deletionTimestamp"):
                continue
            status = job.setdefault("status", {})
            before = copy.deepcopy(status)
            spec = job["spec"]
            if _job_finished(job):
                self._expire(job)
                continue
            pods = [p for p in self.store.items("pods", job["metadata"]["namespace"]) if _owned_by(p, job)]
            active = [p for p in pods if p["status"].get("phase") not in FINISHED and not _deleting(p)]
            if spec.get("suspend"):
                for pod in active:
                    self.api.delete(RESOURCES["pods"], pod, {}, {})
                _set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended")
                status["active"] = 0
                status.pop("startTime", None)
            else:
                if _condition(status, "Suspended") == "True":
                    _set_condition(status, "Suspended", "False", "JobResumed", "Job resumed")
                status.setdefault("startTime", now_rfc3339())
                indexed = spec.get("completionMode") == "Indexed"
                succeeded = [p for p in pods if p["status"].get("phase") == "Succeeded"]
                failed = [p for p in pods if p["status"].get("phase") == "Failed"]
                done = {_index(p) for p in succeeded} if indexed else set(range(len(succeeded)))
                status["failed"] = max(int(status.get("failed", 0)), len(failed))
                if status["failed"] > int(spec.get("backoffLimit", 6)):
                    for pod in active:
                        self.api.delete(RESOURCES["pods"], pod, {}, {})
                    message = "Job has reached the specified backoff limit"
                    _set_condition(status, "FailureTarget", "True", "BackoffLimitExceeded", message)
                    _set_condition(status, "Failed", "True", "BackoffLimitExceeded", message)
                elif len(done) >= int(spec["completions"]):
                    _set_condition(
                        status,
                        "SuccessCriteriaMet",
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                    )
                    _set_condition(
                        status, "Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"
                    )
                    status["completionTime"] = now_rfc3339()
                else:
                    self._create_pods(job, active, done, indexed)
                status["succeeded"] = len(done)
                status["active"] = len(
                    [p for p in pods if p["status"].get("phase") not in FINISHED and not _deleting(p)]
                )
                status["ready"] = len([p for p in active if p["status"].get("phase") == "Running"])
                if indexed and done:
                    status["completedIndexes"] = _ranges(sorted(done))
            status["terminating"] = len([p for p in pods if _deleting(p)])
            if status != before:
                self.api.update_internal("jobs", job)

    def _create_pods(self, job: dict[str, Any], active: list[dict[str, Any]], done: set[int], indexed: bool) -> None:
        spec = job["spec"]
        running = len(active)
        wanted = range(int(spec["completions"])) if indexed else range(int(spec["completions"]) - len(done))
        taken = {_index(p) for p in active}
        for index in wanted:
            if running >= int(spec.get("parallelism", 1)):
                return
            if indexed and (index in done or index in taken):
                continue
            if not indexed and running + len(done) >= int(spec["completions"]):
                return
            template = copy.deepcopy(spec["template"])
            metadata = template.setdefault("metadata", {})
            name = job["metadata"]["name"]
            metadata["namespace"] = job["metadata"]["namespace"]
            metadata["generateName"] = f"{name}-{index}-" if indexed else f"{name}-"
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            pod_spec = template["spec"]
            if indexed:
                metadata.setdefault("labels", {})[INDEX_KEY] = str(index)
                metadata.setdefault("annotations", {})[INDEX_KEY] = str(index)
                pod_spec["hostname"] = f"{name}-{index}"
                for container in pod_spec.get("containers", []):
                    container.setdefault("env", []).append(
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
                        }
                    )
            try:
                self.api.create_internal("pods", {"apiVersion": "v1", "kind": "Pod", **template})
            except ApiError as error:
                if job["metadata"]["uid"] not in self.failed_creates:  # once, as a FailedCreate event would
                    print(f"fake-kube: Job {name}: FailedCreate: {error.message}", file=sys.stderr)
                    self.failed_creates.add(job["metadata"]["uid"])
                return
            running += 1

    def _expire(self, job: dict[str, Any]) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        finished = next(
            (
                c["lastTransitionTime"]
                for c in job["status"].get("conditions", [])
                if c["type"] in ("Complete", "Failed")
            ),
            None,
        )
        if finished and time.time() - _epoch(finished) >= int(ttl):
            self.api.delete(RESOURCES["jobs"], job, {"propagationPolicy": "Background"}, {})

    # Scheduler --------------------------------------------------------------------------------

    def schedule(self) -> None:
        nodes = self.store.items("nodes")
        for pod in self.store.items("pods"):
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulingGates") or _deleting(pod):
                continue
            if pod["status"].get("phase") != "Pending":
                continue
            reasons = []
            for node in nodes:
                why = self._unfit(pod, node)
                if not why:
                    spec["nodeName"] = node["metadata"]["name"]
                    refresh_pod_conditions(pod)
                    self.api.update_internal("pods", pod)
                    break
                reasons.append(why)
            else:
                message = f"0/{len(nodes)} nodes are available: {', '.join(sorted(set(reasons))) or 'no nodes'}."
                current = next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
                if current.get("message") != message:
                    pod["status"]["conditions"] = [
                        c for c in pod["status"].get("conditions", []) if c["type"] != "PodScheduled"
                    ]
                    pod["status"]["conditions"].append(
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                            "lastTransitionTime": now_rfc3339(),
                        }
                    )
                    self.api.update_internal("pods", pod)

    def _unfit(self, pod: dict[str, Any], node: dict[str, Any]) -> str:
        spec, labels = pod["spec"], node["metadata"].get("labels") or {}
        if node["spec"].get("unschedulable"):
            return "node(s) were unschedulable"
        if not _ready(node):
            return "node(s) were not ready"
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                _tolerates(t, taint) for t in spec.get("tolerations") or []
            ):
                return "node(s) had untolerated taint(s)"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms") or []
        if terms and not any(all(_expression(e, labels) for e in t.get("matchExpressions") or []) for t in terms):
            return "node(s) didn't match Pod's node affinity/selector"
        allocatable = node["status"].get("allocatable") or {}
        used: dict[str, Decimal] = {}
        bound = [
            p
            for p in self.store.items("pods")
            if p["spec"].get("nodeName") == node["metadata"]["name"] and p["status"].get("phase") not in FINISHED
        ]
        for other in bound:
            for resource, amount in semantics.pod_requests(other).items():
                used[resource] = used.get(resource, Decimal(0)) + amount
        if len(bound) + 1 > int(allocatable.get("pods", 110)):
            return "Too many pods"
        for resource, amount in semantics.pod_requests(pod).items():
            if amount == 0:
                continue
            if resource not in allocatable:
                return f"Insufficient {resource}"
            if used.get(resource, Decimal(0)) + amount > semantics.quantity(allocatable[resource]):
                return f"Insufficient {resource}"
        return ""

    # Kubelet ----------------------------------------------------------------------------------

    def kubelet(self) -> None:
        for pod in self.store.items("pods"):
            uid = pod["metadata"]["uid"]
            run = self.runs.get(uid)
            if _deleting(pod):
                self._stop(pod, run)
                continue
            node = self.store.get("nodes", "", pod["spec"].get("nodeName") or "")
            if node is None or not _ready(node) or run is not None:
                continue
            if pod["status"].get("phase") in FINISHED:
                continue
            missing = self._missing_volume(pod)
            if missing:
                self._waiting(pod, "ContainerCreating", f"MountVolume.SetUp failed: {missing} not found")
                continue
            run = self.runs[uid] = PodRun(uid, pod["metadata"]["namespace"], pod["metadata"]["name"])
            asyncio.get_running_loop().create_task(self._run_pod(run))

    def _stop(self, pod: dict[str, Any], run: PodRun | None) -> None:
        if run is None or run.done:
            self.store.remove("pods", pod)
            self.runs.pop(pod["metadata"]["uid"], None)
            return
        grace = int(pod["metadata"].get("deletionGracePeriodSeconds", 30))
        now = time.monotonic()
        if run.term_sent_at is None:
            run.term_sent_at = now
            _signal(run, signal.SIGTERM)
        elif now - run.term_sent_at >= grace:
            _signal(run, signal.SIGKILL)

    def _missing_volume(self, pod: dict[str, Any]) -> str:
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes", []):
            for kind, plural, key in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
                source = volume.get(kind)
                if source and not source.get("optional") and self.store.get(plural, namespace, source[key]) is None:
                    return f'{plural[:-1]} "{source[key]}"'
        return ""

    def _waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            for c in pod["spec"]["containers"]
        ]
        if pod["status"].get("containerStatuses") != statuses:
            pod["status"]["containerStatuses"] = statuses
            self.api.update_internal("pods", pod)

    def _current(self, run: PodRun) -> dict[str, Any] | None:
        pod = self.store.get("pods", run.namespace, run.name)
        return pod if pod is not None and pod["metadata"]["uid"] == run.uid else None

    async def _run_pod(self, run: PodRun) -> None:
        pod = self._current(run)
        if pod is None:
            run.done = True
            return
        rootfs = self.root / "pods" / run.uid
        try:
            self._mount(pod, rootfs)
        except OSError as error:
            self._waiting(pod, "CreateContainerError", str(error))
            run.done = True
            return
        restart = pod["spec"].get("restartPolicy", "Always")
        tasks = [self._run_container(run, pod, container, rootfs, restart) for container in pod["spec"]["containers"]]
        pod["status"].update(phase="Running", startTime=now_rfc3339(), hostIP="127.0.0.1", podIP="127.0.0.1")
        self._publish(run)
        await asyncio.gather(*tasks)
        run.done = True
        pod = self._current(run)
        if pod is not None and not _deleting(pod):
            codes = [c.exit_code for c in run.containers.values()]
            pod["status"]["phase"] = "Succeeded" if all(code == 0 for code in codes) else "Failed"
            self._publish(run)

    async def _run_container(
        self, run: PodRun, pod: dict[str, Any], container: dict[str, Any], rootfs: Path, restart: str
    ) -> None:
        state = run.containers[container["name"]] = ContainerRun(container["name"])
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        restarts = 0
        while True:
            if not argv:
                state.lines.append((now_rfc3339_nano(), "fake kubelet: the container has no command to run"))
                state.exit_code, state.started_at, state.finished_at = 128, now_rfc3339(), now_rfc3339()
                self._publish(run)
                return
            cwd = rootfs / container.get("workingDir", "/").lstrip("/")
            cwd.mkdir(parents=True, exist_ok=True)
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=self._env(pod, container),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as error:
                state.lines.append((now_rfc3339_nano(), f"fake kubelet: cannot start {argv[0]}: {error}"))
                state.exit_code, state.started_at, state.finished_at = 127, now_rfc3339(), now_rfc3339()
                self._publish(run)
                return
            state.process, state.exit_code, state.started_at = process, None, now_rfc3339()
            self._publish(run)
            assert process.stdout is not None
            while raw := await process.stdout.readline():
                state.lines.append((now_rfc3339_nano(), raw.decode(errors="replace").rstrip("\n")))
            state.exit_code = await process.wait()
            if state.exit_code < 0:
                state.exit_code = 128 - state.exit_code  # killed by a signal: 128 + its number, as runtimes report
            state.finished_at = now_rfc3339()
            current = self._current(run)
            again = restart == "Always" or (restart == "OnFailure" and state.exit_code != 0)
            if not again or current is None or _deleting(current):
                self._publish(run)
                return
            restarts += 1
            self._publish(run, restarts)
            await asyncio.sleep(min(5.0, 0.2 * restarts))

    def _publish(self, run: PodRun, restarts: int = 0) -> None:
        pod = self._current(run)
        if pod is None:
            return
        statuses = []
        for container in pod["spec"]["containers"]:
            state = run.containers.get(container["name"])
            entry: dict[str, Any] = {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "restartCount": restarts,
                "ready": False,
                "started": False,
            }
            if state is None or not state.started_at:
                entry["state"] = {"waiting": {"reason": "ContainerCreating"}}
            elif state.exit_code is None:
                entry.update(ready=True, started=True, state={"running": {"startedAt": state.started_at}})
            else:
                entry["state"] = {
                    "terminated": {
                        "exitCode": state.exit_code,
                        "reason": "Completed" if state.exit_code == 0 else "Error",
                        "startedAt": state.started_at,
                        "finishedAt": state.finished_at,
                    }
                }
            statuses.append(entry)
        pod["status"]["containerStatuses"] = statuses
        ready = all(s.get("ready") for s in statuses)
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] not in ("Ready", "ContainersReady")]
        for kind in ("Ready", "ContainersReady"):
            conditions.append(
                {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339()}
            )
        pod["status"]["conditions"] = conditions
        self.api.update_internal("pods", pod)

    def _mount(self, pod: dict[str, Any], rootfs: Path) -> None:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        namespace = pod["metadata"]["namespace"]
        for container in pod["spec"]["containers"]:
            for mount in sorted(container.get("volumeMounts", []), key=lambda m: len(m["mountPath"])):
                target = rootfs / mount["mountPath"].lstrip("/")
                volume = volumes[mount["name"]]
                files = self._volume_files(volume, namespace)
                if files is None:  # emptyDir and the like: a directory
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if mount.get("subPath"):
                    if mount["subPath"] not in files:
                        raise OSError(f"subPath {mount['subPath']!r} is not in volume {mount['name']}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(files[mount["subPath"]])
                    if mount.get("readOnly"):
                        target.chmod(0o444)
                    continue
                for path, content in files.items():
                    (target / path).parent.mkdir(parents=True, exist_ok=True)
                    (target / path).write_bytes(content)

    def _volume_files(self, volume: dict[str, Any], namespace: str) -> dict[str, bytes] | None:
        if "configMap" in volume:
            source = volume["configMap"]
            obj = self.store.get("configmaps", namespace, source["name"]) or {}
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        elif "secret" in volume:
            source = volume["secret"]
            obj = self.store.get("secrets", namespace, source["secretName"]) or {}
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            return None
        if source.get("items"):
            return {item["path"]: data[item["key"]] for item in source["items"] if item["key"] in data}
        return data

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {key: os.environ[key] for key in BASE_ENV if key in os.environ}
        env["HOSTNAME"] = pod["spec"].get("hostname") or pod["metadata"]["name"]
        env["HOME"] = "/root"
        namespace = pod["metadata"]["namespace"]
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = entry["value"]
                continue
            source = entry.get("valueFrom") or {}
            if "fieldRef" in source:
                env[entry["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                obj = self.store.get("configmaps", namespace, ref["name"]) or {}
                env[entry["name"]] = (obj.get("data") or {}).get(ref["key"], "")
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                obj = self.store.get("secrets", namespace, ref["name"]) or {}
                env[entry["name"]] = base64.b64decode((obj.get("data") or {}).get(ref["key"], "")).decode()
        return env

    def read_log(self, pod: dict[str, Any], container: str) -> list[tuple[str, str]] | None:
        run = self.runs.get(pod["metadata"]["uid"])
        state = run.containers.get(container) if run is not None else None
        if state is None or not state.started_at:
            return None
        return list(state.lines)

    # Garbage collector ------------------------------------------------------------------------

    def garbage_collect(self) -> None:
        uids = {obj["metadata"]["uid"] for objects in self.store.objects.values() for obj in objects.values()}
        for plural, objects in self.store.objects.items():
            for obj in list(objects.values()):
                references = obj["metadata"].get("ownerReferences") or []
                if references and not any(r.get("uid") in uids for r in references):
                    self._collect(plural, obj)
        for plural, objects in self.store.objects.items():
            for obj in list(objects.values()):
                metadata = obj["metadata"]
                if not metadata.get("deletionTimestamp") or "foregroundDeletion" not in metadata.get("finalizers", []):
                    continue
                dependents = self.api.dependents(metadata["uid"])
                for dependent_plural, dependent in dependents:
                    self._collect(dependent_plural, dependent)
                if not dependents:
                    self.store.remove(plural, obj)

    def _collect(self, plural: str, obj: dict[str, Any]) -> None:
        if plural == "pods":
            if not _deleting(obj):
                self.api.delete(RESOURCES["pods"], obj, {}, {})
        elif not obj["metadata"].get("deletionTimestamp"):
            self.api.delete(RESOURCES[plural], obj, {"propagationPolicy": "Background"}, {})


# Helpers -------------------------------------------------------------------------------------------


def _signal(run: PodRun, sig: int) -> None:
    for container in run.containers.values():
        if container.process is not None and container.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, sig)


def _gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == KUEUE_GATE for g in pod["spec"].get("schedulingGates") or [])


def _deleting(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _owned_by(pod: dict[str, Any], job: dict[str, Any]) -> bool:
    return any(r.get("uid") == job["metadata"]["uid"] for r in pod["metadata"].get("ownerReferences", []))


def _index(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(INDEX_KEY, -1))


def _job_finished(job: dict[str, Any]) -> bool:
    return any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in job.get("status", {}).get("conditions", [])
    )


def _condition(status: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in status.get("conditions", []) if c["type"] == kind), None)


def _set_condition(status: dict[str, Any], kind: str, value: str, reason: str, message: str) -> None:
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition["type"] == kind:
            if condition["status"] != value or condition.get("reason") != reason:
                condition.update(status=value, reason=reason, message=message, lastTransitionTime=now_rfc3339())
            return
    conditions.append(
        {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "lastProbeTime": now_rfc3339(),
            "lastTransitionTime": now_rfc3339(),
        }
    )


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")


def _expression(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expression["key"], expression["operator"], expression.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels:
        try:
            return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])
        except ValueError:
            return False
    return False


def _field(pod: dict[str, Any], path: str) -> str:
    metadata = pod["metadata"]
    for prefix, source in (("metadata.annotations", "annotations"), ("metadata.labels", "labels")):
        if path.startswith(prefix + "['"):
            return str((metadata.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    simple = {
        "metadata.name": metadata["name"],
        "metadata.namespace": metadata["namespace"],
        "metadata.uid": metadata["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path, ""))


def _ranges(indexes: list[int]) -> str:
    parts, start = [], None
    for i, index in enumerate(indexes):
        if start is None:
            start = index
        if i + 1 == len(indexes) or indexes[i + 1] != index + 1:
            parts.append(f"{start}" if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts)


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))  # UTC, whatever the local zone

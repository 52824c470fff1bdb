"""The fake API server: the subset of core/v1, batch/v1 and scheduling.k8s.io/v1 the adapter uses,
over real HTTP, with the API server's own rules for what it accepts.

Every body it receives is validated against the Kubernetes OpenAPI schema (``kubernetes-validate``,
strict: unknown fields are errors), then against the semantic rules in ``semantics``. Objects get
``uid``, ``resourceVersion``, ``creationTimestamp`` and ``generation``; updates and deletes honour
``resourceVersion`` and ``uid`` preconditions; lists honour label and field selectors and
``limit``/``continue``. Callers are authenticated by bearer token and authorized by RBAC-style rules,
so a test can hold the adapter to exactly the permissions the README asks for.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from aiohttp import web

from devtools.fake_kube import semantics
from devtools.fake_kube.semantics import KUEUE_GATE, ApiError


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    api_version: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = {
    r.plural: r
    for r in (
        Resource("namespaces", "Namespace", "v1", False),
        Resource("nodes", "Node", "v1", False),
        Resource("pods", "Pod", "v1", True),
        Resource("configmaps", "ConfigMap", "v1", True),
        Resource("secrets", "Secret", "v1", True),
        Resource("jobs", "Job", "batch/v1", True),
        Resource("priorityclasses", "PriorityClass", "scheduling.k8s.io/v1", False),
    )
}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DELETE_OPTIONS = {
    "apiVersion",
    "kind",
    "propagationPolicy",
    "preconditions",
    "gracePeriodSeconds",
    "orphanDependents",
    "dryRun",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339_nano() -> str:
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


class Store:
    """All objects, by resource, namespace and name; every write bumps the global resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {plural: {} for plural in RESOURCES}
        self.version = 1000

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects[plural].get((namespace, name))

    def items(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        found = self.objects[plural]
        return [obj for (ns, _), obj in sorted(found.items()) if namespace is None or ns == namespace]

    def save(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        metadata = obj["metadata"]
        metadata["resourceVersion"] = str(self.version)
        self.objects[plural][(metadata.get("namespace", ""), metadata["name"])] = obj
        return obj

    def remove(self, plural: str, obj: Mapping[str, Any]) -> None:
        self.version += 1
        metadata = obj["metadata"]
        self.objects[plural].pop((metadata.get("namespace", ""), metadata["name"]), None)


class FakeApiServer:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.store = Store()
        self.kube_version = str(config.get("kube_version", "1.34"))
        self.tokens: dict[str, Any] = dict(config.get("tokens") or {"fake-admin-token": "admin"})
        self.local_queues: dict[str, str] = dict((config.get("kueue") or {}).get("local_queues") or {})
        self.requests_seen: list[tuple[str, str]] = []  # (verb, resource) the adapter used: for RBAC docs
        for name in config.get("namespaces", ["default"]):
            self.create_internal("namespaces", {"metadata": {"name": name}})
        for name, value in (config.get("priority_classes") or {}).items():
            self.create_internal("priorityclasses", {"metadata": {"name": name}, "value": int(value)})
        for node in config.get("nodes", []):
            self.create_internal("nodes", node_object(node))

    # Internal writes (controllers) ---------------------------------------------------------------

    def create_internal(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        resource = RESOURCES[plural]
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        if self.store.get(plural, metadata.get("namespace", ""), metadata["name"]) is not None:
            raise ApiError(409, "AlreadyExists", f'{resource.qualified} "{metadata["name"]}" already exists')
        self.admit(plural, obj)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        metadata["generation"] = 1
        return self.store.save(plural, obj)

    def update_internal(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store.save(plural, obj)

    # Admission: defaults and the rules that need other objects ----------------------------------

    def admit(self, plural: str, obj: dict[str, Any]) -> None:
        metadata = obj["metadata"]
        if plural == "pods":
            spec = obj.setdefault("spec", {})
            semantics.default_pod_spec(spec)
            class_name = spec.get("priorityClassName")
            if class_name:
                priority_class = self.store.get("priorityclasses", "", class_name)
                if priority_class is None:
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'pods "{metadata["name"]}" is forbidden: no PriorityClass with name {class_name} was found',
                    )
                spec["priority"] = priority_class["value"]
            else:
                spec.setdefault("priority", 0)
            labels = metadata.setdefault("labels", {})
            owned_by_job = any(ref.get("kind") == "Job" for ref in metadata.get("ownerReferences", []))
            if labels.get(QUEUE_LABEL) and not owned_by_job:
                # Kueue's pod webhook: a queued plain pod waits behind the admission gate.
                gates = spec.setdefault("schedulingGates", [])
                if not any(g["name"] == KUEUE_GATE for g in gates):
                    gates.append({"name": KUEUE_GATE})
                labels["kueue.x-k8s.io/managed"] = "true"
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            refresh_pod_conditions(obj)
        elif plural == "jobs":
            spec = obj.setdefault("spec", {})
            spec.setdefault("parallelism", 1)
            spec.setdefault("completions", spec["parallelism"] if spec.get("completionMode") == "Indexed" else 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
            if metadata.get("labels", {}).get(QUEUE_LABEL):
                spec["suspend"] = True  # Kueue's job webhook: a queued Job starts suspended
            semantics.default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
            obj["status"] = {}
        elif plural == "nodes":
            obj.setdefault("spec", {})
            obj.setdefault("status", {})
        elif plural == "secrets":
            obj.setdefault("type", "Opaque")
            for key, value in (obj.pop("stringData", None) or {}).items():
                obj.setdefault("data", {})[key] = base64.b64encode(value.encode()).decode()

    def finish_job_create(self, job: dict[str, Any]) -> None:
        """The selector the API server generates, and the labels it adds to the pod template."""
        uid = job["metadata"]["uid"]
        name = job["metadata"]["name"]
        template_labels = job["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
        template_labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
            }
        )
        job["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        self.store.save("jobs", job)

    # Validation ---------------------------------------------------------------------------------

    def validate_schema(self, resource: Resource, body: Mapping[str, Any]) -> None:
        name = (body.get("metadata") or {}).get("name") or (body.get("metadata") or {}).get("generateName", "")
        try:
            kubernetes_validate.validate(dict(body), self.kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            raise semantics.invalid(resource.kind, name, [f"{path}: {error.message}"]) from None
        except kubernetes_validate.SchemaNotFoundError as error:
            raise ApiError(400, "BadRequest", f"no schema for this object: {error}") from None

    def validate_semantics(self, resource: Resource, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
        metadata = obj.get("metadata", {})
        name_rule = "label" if resource.plural == "namespaces" else "subdomain"
        max_name = 63 if resource.plural in ("namespaces", "jobs") else 253
        problems = semantics.check_metadata(metadata, name_rule=name_rule, max_name=max_name)
        if resource.plural == "pods":
            problems += semantics.validate_pod_spec(obj.get("spec", {}))
            if old is not None:
                problems += semantics.check_pod_update(old, obj)
        elif resource.plural == "jobs":
            problems += semantics.validate_job(obj)
            if old is not None:
                problems += semantics.check_job_update(old, obj)
        elif resource.plural in ("configmaps", "secrets"):
            problems += semantics.validate_config_data(obj, resource.kind)
        if problems:
            raise semantics.invalid(resource.kind, metadata.get("name", ""), problems)

    # Requests -----------------------------------------------------------------------------------

    def authorize(self, request: web.Request, verb: str, resource: str, namespace: str) -> None:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if token not in self.tokens:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        rules = self.tokens[token]
        self.requests_seen.append((verb, resource))
        if rules == "admin":
            return
        for rule in rules:
            if rule.get("namespace") and rule["namespace"] != namespace:
                continue
            group = RESOURCES[resource.split("/")[0]].group
            if (
                group in rule.get("apiGroups", [""])
                and resource in rule.get("resources", [])
                and verb in rule.get("verbs", [])
            ):
                return
        where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        raise ApiError(
            403,
            "Forbidden",
            f'{resource} is forbidden: User "adapter" cannot {verb} resource "{resource}" in API group '
            f'"{RESOURCES[resource.split("/")[0]].group}"{where}',
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as error:
            return web.json_response(error.status(), status=error.code)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path == "/version":
            major, minor = self.kube_version.split(".")
            return web.json_response({"major": major, "minor": minor, "gitVersion": f"v{self.kube_version}.0-fake"})
        segments = path.split("/")[1:]
        if segments[:2] == ["api", "v1"]:
            rest, group_version = segments[2:], "v1"
        elif segments[:1] == ["apis"] and len(segments) >= 3:
            rest, group_version = segments[3:], f"{segments[1]}/{segments[2]}"
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]].api_version != group_version:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        resource = RESOURCES[rest[0]]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in ("status", "log"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        method = request.method
        verb = {
            "GET": "get" if name else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
        if _true(request.query.get("watch")):
            raise ApiError(405, "MethodNotAllowed", "watch is not supported by this fake API server")
        self.authorize(request, verb, f"{resource.plural}/{sub}" if sub else resource.plural, namespace)
        if namespace and self.store.get("namespaces", "", namespace) is None and method == "POST":
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
        if verb == "list":
            return web.json_response(self.list(resource, namespace, request.query))
        if verb == "create":
            return web.json_response(self.create(resource, namespace, await self._body(request)), status=201)
        existing = self.store.get(resource.plural, namespace, name)
        if existing is None:
            raise ApiError(
                404, "NotFound", f'{resource.qualified} "{name}" not found', {"name": name, "kind": resource.plural}
            )
        if sub == "log":
            return self.logs(existing, request.query)
        if verb == "get":
            return web.json_response(existing)
        if verb == "delete":
            return web.json_response(self.delete(resource, existing, await self._body(request, {}), request.query))
        if verb == "update":
            body = await self._body(request)
            return web.json_response(self.replace(resource, existing, body, sub))
        body = await self._body(request)
        content_type = request.headers.get("Content-Type", "")
        if "json-patch" in content_type:
            patched = semantics.json_patch(existing, body)
        elif "strategic-merge-patch" in content_type:
            patched = semantics.strategic_merge_patch(existing, body)
        elif "merge-patch" in content_type:
            patched = semantics.merge_patch(existing, body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        return web.json_response(self.replace(resource, existing, patched, sub, from_patch=True))

    async def _body(self, request: web.Request, default: Any = None) -> Any:
        raw = await request.read()
        if not raw:
            if default is not None:
                return default
            raise ApiError(400, "BadRequest", "the request has no body")
        try:
            return json.loads(raw)
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {error}") from None

    def list(self, resource: Resource, namespace: str, query: Mapping[str, str]) -> dict[str, Any]:
        labels = semantics.parse_label_selector(query.get("labelSelector", ""))
        fields = semantics.parse_field_selector(query.get("fieldSelector", ""), resource.plural)
        matched = [
            obj
            for obj in self.store.items(resource.plural, namespace or None)
            if labels(obj["metadata"].get("labels") or {}) and fields(obj)
        ]
        start = 0
        if query.get("continue"):
            try:
                start = int(json.loads(base64.urlsafe_b64decode(query["continue"]))["start"])
            except (ValueError, KeyError):
                raise ApiError(400, "BadRequest", "invalid continue token") from None
        limit = int(query.get("limit") or 0)
        page = matched[start : start + limit] if limit else matched[start:]
        metadata: dict[str, Any] = {"resourceVersion": str(self.store.version)}
        if limit and start + limit < len(matched):
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps({"start": start + limit}).encode()).decode()
            metadata["remainingItemCount"] = len(matched) - start - limit
        return {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": metadata, "items": page}

    def create(self, resource: Resource, namespace: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        if body.get("kind") != resource.kind or body.get("apiVersion") != resource.api_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the body's kind/apiVersion ({body.get('kind')}, {body.get('apiVersion')}) is not "
                f"{resource.kind} {resource.api_version}",
            )
        metadata = body.setdefault("metadata", {})
        if resource.namespaced:
            if metadata.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            metadata["namespace"] = namespace
        self.validate_schema(resource, body)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        self.validate_semantics(resource, body, None)
        for field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
            metadata.pop(field, None)
        # Dangling ownerReferences are accepted, as real API servers do; the garbage collector deletes them.
        created = self.create_internal(resource.plural, body)
        if resource.plural == "jobs":
            self.finish_job_create(created)
        return created

    def replace(
        self, resource: Resource, existing: dict[str, Any], body: Any, sub: str, *, from_patch: bool = False
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != existing["metadata"]["resourceVersion"] and not from_patch:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.qualified} "{existing["metadata"]["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
            )
        if from_patch and wanted and wanted != existing["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified (resourceVersion in the patch is stale)")
        new = copy.deepcopy(existing)
        if sub == "status":
            new["status"] = copy.deepcopy(body.get("status", {}))
        else:
            new = copy.deepcopy(body)
            new.setdefault("apiVersion", resource.api_version)
            new.setdefault("kind", resource.kind)
            if "status" in existing:
                new["status"] = copy.deepcopy(existing["status"])  # the main resource does not change status
            metadata = new.setdefault("metadata", {})
            for field in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "generation"):
                if field in existing["metadata"]:
                    metadata[field] = existing["metadata"][field]
            if new.get("spec") != existing.get("spec"):
                metadata["generation"] = int(existing["metadata"].get("generation", 1)) + 1
        self.validate_schema(resource, new)
        self.validate_semantics(resource, new, existing)
        if resource.plural == "pods":
            refresh_pod_conditions(new)
        return self.store.save(resource.plural, new)

    def delete(
        self, resource: Resource, existing: dict[str, Any], options: Any, query: Mapping[str, str]
    ) -> dict[str, Any]:
        if not isinstance(options, dict):
            raise ApiError(400, "BadRequest", "DeleteOptions must be an object")
        unknown = set(options) - DELETE_OPTIONS
        unknown |= set(options.get("preconditions") or {}) - {"uid", "resourceVersion"}
        if unknown:  # kubernetes-validate has no schema for DeleteOptions: the same strictness, by hand
            raise ApiError(400, "BadRequest", f"DeleteOptions: unknown field(s) {sorted(unknown)}")
        preconditions = options.get("preconditions") or {}
        metadata = existing["metadata"]
        for field, actual in (("uid", metadata["uid"]), ("resourceVersion", metadata["resourceVersion"])):
            if preconditions.get(field) and preconditions[field] != actual:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {field.upper() if field == 'uid' else 'ResourceVersion'} in precondition: "
                    f"{preconditions[field]}, {field.upper() if field == 'uid' else 'ResourceVersion'} in object meta: "
                    f"{actual}",
                )
        policy = options.get("propagationPolicy") or query.get("propagationPolicy")
        if policy is None:
            policy = "Orphan" if resource.plural == "jobs" else "Background"  # batch/v1 Jobs orphan by default
        if policy not in ("Orphan", "Background", "Foreground"):
            raise ApiError(400, "BadRequest", f"propagationPolicy: Unsupported value: {policy!r}")
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        if resource.plural == "pods":
            spec_grace = existing["spec"].get("terminationGracePeriodSeconds", 30)
            grace = int(spec_grace if grace is None else grace)
            if not metadata.get("deletionTimestamp"):
                metadata["deletionTimestamp"] = now_rfc3339()
                metadata["deletionGracePeriodSeconds"] = grace
                self.store.save("pods", existing)
            # The kubelet stops a running pod and removes it; a pod never started goes at once.
            if (
                grace == 0
                or not existing.get("spec", {}).get("nodeName")
                or existing["status"].get("phase")
                in (
                    "Succeeded",
                    "Failed",
                )
            ):
                self.store.remove("pods", existing)
            return existing
        if policy == "Foreground":
            if not metadata.get("deletionTimestamp"):
                metadata["deletionTimestamp"] = now_rfc3339()
                metadata.setdefault("finalizers", []).append("foregroundDeletion")
                self.store.save(resource.plural, existing)
            return existing
        if policy == "Orphan":
            for dependent in self.dependents(metadata["uid"]):
                dependent[1]["metadata"]["ownerReferences"] = [
                    r for r in dependent[1]["metadata"]["ownerReferences"] if r["uid"] != metadata["uid"]
                ]
                self.store.save(*dependent)
        self.store.remove(resource.plural, existing)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": metadata["name"], "kind": resource.plural, "uid": metadata["uid"]},
        }

    def dependents(self, uid: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (plural, obj)
            for plural, objects in self.store.objects.items()
            for obj in list(objects.values())
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))
        ]

    # Logs -------------------------------------------------------------------------------------

    log_reader: Callable[[dict[str, Any], str], list[tuple[str, str]] | None] | None = None

    def logs(self, pod: dict[str, Any], query: Mapping[str, str]) -> web.Response:
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        container = query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            raise ApiError(
                400,
                "BadRequest",
                f"a container name must be specified for pod {pod['metadata']['name']}, choose one of: {containers}",
            )
        lines = self.log_reader(pod, container) if self.log_reader else None
        if lines is None:
            waiting = "ContainerCreating"
            for status in pod["status"].get("containerStatuses", []):
                if status["name"] == container and "waiting" in status.get("state", {}):
                    waiting = status["state"]["waiting"].get("reason", waiting)
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{pod["metadata"]["name"]}" is waiting to start: {waiting}',
            )
        if query.get("sinceSeconds"):
            cutoff = time.time_ns() - int(query["sinceSeconds"]) * 10**9
            lines = [(stamp, text) for stamp, text in lines if _stamp_ns(stamp) >= cutoff]
        if query.get("sinceTime"):
            cutoff = _stamp_ns(query["sinceTime"])
            lines = [(stamp, text) for stamp, text in lines if _stamp_ns(stamp) >= cutoff]
        if query.get("tailLines"):
            lines = lines[-int(query["tailLines"]) :] if int(query["tailLines"]) else []
        timestamps = _true(query.get("timestamps"))
        body = "".join(f"{stamp} {text}\n" if timestamps else f"{text}\n" for stamp, text in lines)
        raw = body.encode()
        if query.get("limitBytes"):
            raw = raw[: int(query["limitBytes"])]
        return web.Response(body=raw, content_type="text/plain")


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _stamp_ns(stamp: str) -> int:
    base, _, rest = stamp.rstrip("Z").partition(".")
    seconds = int(datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
    return seconds * 10**9 + int((rest or "0").ljust(9, "0")[:9])


def refresh_pod_conditions(pod: dict[str, Any]) -> None:
    """A gated pod is ``PodScheduled=False/SchedulingGated``; a bound one is scheduled."""
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions", []) if c["type"] != "PodScheduled"]
    if pod["spec"].get("schedulingGates"):
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
                "lastTransitionTime": now_rfc3339(),
            }
        )
    elif pod["spec"].get("nodeName"):
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
    else:
        previous = next((c for c in status.get("conditions", []) if c["type"] == "PodScheduled"), None)
        if previous is not None and previous.get("reason") != "SchedulingGated":
            conditions.append(previous)
    status["conditions"] = conditions


def node_object(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node from the fake's configuration: ``{name, labels, allocatable, taints, unschedulable, ready}``."""
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", **dict(node.get("allocatable") or {})}
    return {
        "metadata": {"name": node["name"], "labels": dict(node.get("labels") or {})},
        "spec": {"unschedulable": bool(node.get("unschedulable", False)), "taints": list(node.get("taints") or [])},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if node.get("ready", True) else "False",
                    "reason": "KubeletReady" if node.get("ready", True) else "KubeletNotReady",
                    "lastTransitionTime": now_rfc3339(),
                }
            ],
        },
    }

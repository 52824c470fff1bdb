"""What the fake API server enforces beyond the OpenAPI schema: names, labels, selectors, patches,
quantities, and the per-kind rules the adapter relies on (pods, jobs, ConfigMaps, Secrets)."""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
KUEUE_GATE = "kueue.x-k8s.io/admission"
MAX_CONFIG_BYTES = 1_048_576


class ApiError(Exception):
    """An answer the API server gives instead of the object: a ``Status`` with a code and a reason."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def invalid(kind: str, name: str, problems: list[str]) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {"; ".join(problems)}'
        if len(problems) > 1
        else f'{kind} "{name}" is invalid: ' + problems[0],
        {"name": name, "kind": kind.lower(), "causes": [{"message": p} for p in problems]},
    )


# Names, labels, annotations ----------------------------------------------------------------------


def check_qualified_key(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix part must be a lowercase RFC 1123 subdomain, got {prefix!r}"
    if len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            f"alphanumeric character (at most 63), got {name!r}"
        )
    return None


def check_metadata(metadata: Mapping[str, Any], *, name_rule: str = "subdomain", max_name: int = 253) -> list[str]:
    problems = []
    name = metadata.get("name", "")
    pattern = DNS_LABEL if name_rule == "label" else DNS_SUBDOMAIN
    if not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif len(name) > max_name or not pattern.fullmatch(name):
        problems.append(
            f"metadata.name: Invalid value: {name!r}: must be a lowercase RFC 1123 {name_rule} of at most {max_name} "
            "characters (lowercase alphanumerics, '-' and '.', starting and ending alphanumeric)"
        )
    for key, value in (metadata.get("labels") or {}).items():
        if (why := check_qualified_key(key)) is not None:
            problems.append(f"metadata.labels: Invalid value: {key!r}: {why}")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            problems.append(
                f"metadata.labels: Invalid value: {value!r}: a valid label must be an empty string or consist of "
                "alphanumerics, '-', '_' or '.', start and end alphanumeric, at most 63 characters"
            )
    annotations = metadata.get("annotations") or {}
    for key in annotations:
        if (why := check_qualified_key(key)) is not None:
            problems.append(f"metadata.annotations: Invalid value: {key!r}: {why}")
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 262_144:
        problems.append("metadata.annotations: Too long: must have at most 262144 bytes")
    return problems


# Selectors ---------------------------------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*"
)


def parse_label_selector(raw: str) -> Callable[[Mapping[str, str]], bool]:
    """Kubernetes label selector syntax: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``."""
    requirements: list[Callable[[Mapping[str, str]], bool]] = []
    for part in _split_top(raw):
        match = _REQUIREMENT.fullmatch(part)
        if match is None or (match["neg"] and (match["op"] or match["setop"])):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: found {part.strip()!r}")
        key = match["key"]
        if (why := check_qualified_key(key)) is not None:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: invalid label key {key!r}: {why}")
        if match["neg"]:
            requirements.append(lambda labels, k=key: k not in labels)
        elif match["op"] in ("=", "=="):
            requirements.append(lambda labels, k=key, v=match["value"]: labels.get(k) == v)
        elif match["op"] == "!=":
            requirements.append(lambda labels, k=key, v=match["value"]: labels.get(k) != v)
        elif match["setop"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            if match["setop"] == "in":
                requirements.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                requirements.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            requirements.append(lambda labels, k=key: k in labels)
    return lambda labels: all(requirement(labels) for requirement in requirements)


def _split_top(raw: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in raw:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [p for p in parts if p.strip()]


FIELD_LABELS = {
    "pods": {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
    },
    "nodes": {"metadata.name", "spec.unschedulable"},
    "jobs": {"metadata.name", "metadata.namespace", "status.successful"},
}


def parse_field_selector(raw: str, resource: str) -> Callable[[Mapping[str, Any]], bool]:
    """``field=value``, ``field==value`` and ``field!=value``, on the fields each resource supports."""
    supported = FIELD_LABELS.get(resource, {"metadata.name", "metadata.namespace"})
    requirements = []
    for part in raw.split(","):
        if not part.strip():
            continue
        match = re.fullmatch(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
        field, op, value = match.groups()
        if field not in supported:
            raise ApiError(400, "BadRequest", f'field label not supported: "{field}"')
        requirements.append((field, op, value))

    def matches(obj: Mapping[str, Any]) -> bool:
        for field, op, value in requirements:
            actual = obj
            for step in field.split("."):
                actual = actual.get(step, {}) if isinstance(actual, Mapping) else {}
            shown = "" if actual in ({}, None) else str(actual).lower() if isinstance(actual, bool) else str(actual)
            if (shown == value) != (op != "!="):
                return False
        return True

    return matches


# Patches -----------------------------------------------------------------------------------------

MERGE_KEYS = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "schedulingGates": "name",
    "ownerReferences": "uid",
    "taints": "key",
    "containerStatuses": "name",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge patch for the lists the API merges by key (conditions by type, ...), ``$patch: delete``."""
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if key is None or not isinstance(target, list):
            return [item for item in copy.deepcopy(patch) if not (isinstance(item, dict) and "$patch" in item)]
        result = copy.deepcopy(target)
        for item in patch:
            if not isinstance(item, dict):
                continue
            index = next((i for i, old in enumerate(result) if old.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    result.pop(index)
            elif index is None:
                result.append({k: v for k, v in item.items() if k != "$patch"})
            else:
                result[index] = strategic_merge_patch(result[index], item)
        return result
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge_patch(result.get(name), value, name)
    return result


def json_patch(target: Any, operations: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, test)."""
    document = copy.deepcopy(target)
    for operation in operations:
        op, path = operation.get("op"), operation.get("path", "")
        steps = [s.replace("~1", "/").replace("~0", "~") for s in path.split("/")[1:]]
        parent = document
        for step in steps[:-1]:
            parent = parent[int(step)] if isinstance(parent, list) else parent[step]
        last = steps[-1] if steps else ""
        try:
            if op == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != operation.get("value"):
                    raise ApiError(422, "Invalid", f"the test operation failed at {path}")
            elif op == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif op in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(operation["value"])
                    elif op == "add":
                        parent.insert(int(last), operation["value"])
                    else:
                        parent[int(last)] = operation["value"]
                else:
                    if op == "replace" and last not in parent:
                        raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing key: {path}")
                    parent[last] = operation["value"]
            else:
                raise ApiError(400, "BadRequest", f"unsupported JSON patch operation {op!r}")
        except (KeyError, IndexError, ValueError, TypeError) as error:
            raise ApiError(422, "Invalid", f"the JSON patch does not apply at {path}: {error}") from None
    return document


# Quantities and requests -------------------------------------------------------------------------


def quantity(value: Any) -> Decimal:
    try:
        return parse_quantity(str(value).strip())
    except (ValueError, ArithmeticError):
        # The API server's own words for a malformed quantity.
        raise ValueError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        ) from None


def is_extended(resource: str) -> bool:
    """Extended resources (``nvidia.com/gpu``) are integers and cannot be overcommitted."""
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests.", "hugepages-"))


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """The effective requests of a pod: containers (plus sidecars) or the heaviest init container."""
    spec = pod.get("spec", {})
    totals: dict[str, Decimal] = {}
    for container in spec.get("containers", []):
        for resource, value in (container.get("resources", {}).get("requests") or {}).items():
            totals[resource] = totals.get(resource, Decimal(0)) + quantity(value)
    for container in spec.get("initContainers", []):
        for resource, value in (container.get("resources", {}).get("requests") or {}).items():
            totals[resource] = max(totals.get(resource, Decimal(0)), quantity(value))
    return totals


# Per-kind rules ----------------------------------------------------------------------------------


def validate_pod_spec(spec: Mapping[str, Any], where: str = "spec") -> list[str]:
    problems = []
    names = set()
    volumes = {v.get("name") for v in spec.get("volumes", [])}
    for i, container in enumerate(spec.get("containers", []) + spec.get("initContainers", [])):
        path = f"{where}.containers[{i}]"
        name = container.get("name", "")
        if not DNS_LABEL.fullmatch(name) or len(name) > 63:
            problems.append(f"{path}.name: Invalid value: {name!r}: must be a DNS-1123 label")
        if name in names:
            problems.append(f"{path}.name: Duplicate value: {name!r}")
        names.add(name)
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for value in {**requests, **limits}.values():
            try:
                quantity(value)
            except ValueError as error:
                problems.append(f"{path}.resources: Invalid value: {value!r}: {error}")
        for resource in set(requests) | set(limits):
            if not is_extended(resource):
                continue
            request, limit = requests.get(resource), limits.get(resource)
            if limit is None:
                problems.append(
                    f"{path}.resources.limits: Required value: Limit must be set for non overcommitable resources"
                )
            elif request is not None and quantity(request) != quantity(limit):
                problems.append(
                    f"{path}.resources.requests[{resource}]: Invalid value: {request!r}: "
                    f"must be equal to {resource} limit of {limit}"
                )
            for value in (request, limit):
                if value is not None and quantity(value) != int(quantity(value)):
                    problems.append(f"{path}.resources: Invalid value: {value!r}: must be an integer")
        for resource in set(requests) & set(limits):
            if not is_extended(resource) and quantity(requests[resource]) > quantity(limits[resource]):
                problems.append(
                    f"{path}.resources.requests: Invalid value: must be less than or equal to {resource} limit"
                )
        mounts = set()
        for mount in container.get("volumeMounts", []):
            if mount.get("name") not in volumes:
                problems.append(f"{path}.volumeMounts.name: Not found: {mount.get('name')!r}")
            if mount.get("mountPath") in mounts:
                problems.append(
                    f"{path}.volumeMounts.mountPath: Invalid value: {mount.get('mountPath')!r}: must be unique"
                )
            mounts.add(mount.get("mountPath"))
            sub = mount.get("subPath", "")
            if sub and (sub.startswith("/") or ".." in sub.split("/")):
                problems.append(
                    f"{path}.volumeMounts.subPath: Invalid value: {sub!r}: must be a relative path without '..'"
                )
    if spec.get("restartPolicy", "Always") not in ("Always", "OnFailure", "Never"):
        problems.append(f"{where}.restartPolicy: Unsupported value: {spec.get('restartPolicy')!r}")
    gates = [g.get("name", "") for g in spec.get("schedulingGates", [])]
    if len(gates) != len(set(gates)):
        problems.append(f"{where}.schedulingGates: Duplicate value")
    for gate in gates:
        if (why := check_qualified_key(gate)) is not None:
            problems.append(f"{where}.schedulingGates.name: Invalid value: {gate!r}: {why}")
    if gates and spec.get("nodeName"):
        problems.append(f"{where}.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared")
    return problems


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        requests = resources.get("requests")
        # A request not given defaults to its limit.
        for resource, value in limits.items():
            if requests is None:
                requests = resources["requests"] = {}
            requests.setdefault(resource, value)
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("imagePullPolicy", "IfNotPresent")


def check_pod_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Pod specs are immutable but for what the real API allows; scheduling gates can only be removed,
    and node selectors may only be added to while the pod is gated."""
    problems = []
    old_spec, new_spec = old.get("spec", {}), new.get("spec", {})
    old_gates = [g["name"] for g in old_spec.get("schedulingGates", [])]
    new_gates = [g["name"] for g in new_spec.get("schedulingGates", [])]
    added = [g for g in new_gates if g not in old_gates]
    if added:
        problems.append(
            f"spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate {added[0]!r}"
        )
    old_selector, new_selector = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
    if old_selector != new_selector:
        if not old_gates:
            problems.append("spec.nodeSelector: Invalid value: field is immutable")
        elif any(new_selector.get(k) != v for k, v in old_selector.items()):
            problems.append("spec.nodeSelector: Invalid value: only additions to spec.nodeSelector are allowed")
    masked = ("schedulingGates", "nodeSelector", "activeDeadlineSeconds", "tolerations", "nodeName")
    if {k: v for k, v in old_spec.items() if k not in masked} != {k: v for k, v in new_spec.items() if k not in masked}:
        problems.append(
            "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), "
            "`spec.schedulingGates` and `spec.nodeSelector` (only while gated)"
        )
    if old_spec.get("nodeName") and new_spec.get("nodeName") != old_spec.get("nodeName"):
        problems.append("spec.nodeName: Forbidden: pod is already bound")
    return problems


def validate_job(job: Mapping[str, Any]) -> list[str]:
    spec = job.get("spec", {})
    problems = validate_pod_spec(spec.get("template", {}).get("spec", {}), "spec.template.spec")
    if spec.get("template", {}).get("spec", {}).get("restartPolicy") not in ("OnFailure", "Never"):
        problems.append('spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"')
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        problems.append("spec.completions: Required value: when completion mode is Indexed")
    for field in ("parallelism", "completions", "backoffLimit"):
        if spec.get(field) is not None and spec[field] < 0:
            problems.append(f"spec.{field}: Invalid value: {spec[field]}: must be greater than or equal to 0")
    return problems


def check_job_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    mutable = {"parallelism", "suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "backoffLimit"}
    old_spec, new_spec = old.get("spec", {}), new.get("spec", {})
    problems = []
    for field in set(old_spec) | set(new_spec):
        if field in mutable or old_spec.get(field) == new_spec.get(field):
            continue
        if field == "template" and old_spec.get("suspend") and not old.get("status", {}).get("startTime"):
            continue  # a suspended Job that never started may have its template changed (Kueue does)
        problems.append(f"spec.{field}: Invalid value: field is immutable")
    return problems


def validate_config_data(obj: Mapping[str, Any], kind: str) -> list[str]:
    problems = []
    size = 0
    for field in ("data", "binaryData", "stringData"):
        for key, value in (obj.get(field) or {}).items():
            if not CONFIG_KEY.fullmatch(key) or len(key) > 253:
                problems.append(
                    f"{field}[{key}]: Invalid value: {key!r}: a valid config key must consist of "
                    "alphanumeric characters, '-', '_' or '.'"
                )
            if field in ("binaryData",) or (kind == "Secret" and field == "data"):
                try:
                    size += len(base64.b64decode(value, validate=True))
                except ValueError:
                    problems.append(f"{field}[{key}]: Invalid value: not base64")
            else:
                size += len(str(value).encode())
    if size > MAX_CONFIG_BYTES:
        problems.append(f"[]: Too long: must have at most {MAX_CONFIG_BYTES} bytes")
    return problems

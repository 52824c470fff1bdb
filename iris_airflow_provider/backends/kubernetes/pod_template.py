"""A backend's ``pod_template``: the peer's own additions to every Job's pods (a service account,
``imagePullSecrets``, env from Secrets, volumes, node selectors, tolerations, a securityContext),
merged with what ``manifests.py`` generates by the cncf-kubernetes provider's own
``PodGenerator.reconcile_pods`` (what its ``KubernetesPodOperator`` does with ``pod_template_file``).

Precedence:

- **The backend wins** on what it relies on: the job's container name, image, command and args,
  resources (GPU requests), its labels and annotations, the Kueue label (on the Job),
  ``restartPolicy: Never``, the priority class and placement affinity, a TPU slice's node
  selector labels (the template's other selectors are kept), the pods' ``subdomain``
  (the rendezvous' Service), the ``IRIS_*`` and rendezvous variables, and its own volumes
  (``result``, ``workdir``, ``files``) and mounts.
- **The template's additions are kept**: volumes and mounts are appended, labels and annotations
  merged, ``serviceAccountName``, ``imagePullSecrets``, ``nodeSelector``, ``securityContext``,
  init containers and the container's ``envFrom`` and ``securityContext`` carried over; its
  tolerations are added to the backend's.
- **The template's env wins over the job's**: it is the peer's configuration (credentials stay on
  the cluster that owns them), so a job naming the same variable does not replace it. The backend's
  ``IRIS_*`` and rendezvous variables may not be named by the template.

Pure: no API calls (the kubernetes client's models only convert).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from iris_airflow_provider.backends.base import RANK_ENV, rendezvous_env
from iris_airflow_provider.backends.kubernetes.results import RESULT_DIR, RESULT_VOLUME

RESERVED_VOLUMES = (RESULT_VOLUME, "workdir", "files")
RESERVED_MOUNTS = (RESULT_DIR, "/iris/workdir")
RESERVED_ENV_PREFIX = "IRIS_"
# The rendezvous' names (MASTER_ADDR, WORLD_SIZE, RANK, ...): the backend's, whatever the template says.
RESERVED_ENV = frozenset(rendezvous_env("replica-0", 0, 1)) | frozenset(RANK_ENV)
# A multi-replica Job's pods are named through its Service (``subdomain``): the template may not rename them.
_BACKEND_POD_FIELDS = ("priorityClassName", "priority", "hostname", "subdomain", "setHostnameAsFQDN")
# What the template may not set on the job's container: the backend decides them.
_BACKEND_CONTAINER_FIELDS = ("command", "args", "resources", "workingDir", "image")


_PLACEHOLDER = "job"


class PodTemplateError(ValueError):
    """A pod template the backend cannot use; the message names the field."""


def checked_pod_template(raw: Any) -> dict[str, Any]:
    """``raw`` (a Pod manifest, as in a ``pod_template_file``) checked field by field: every key must
    be one the Pod API knows (a misspelt key would otherwise be dropped silently), at most one
    container, no reserved volume, mount or ``IRIS_*`` env. Returns it in the API's own form."""
    if not isinstance(raw, Mapping):
        raise PodTemplateError(f"must be a Pod manifest (a mapping with metadata and spec), got {type(raw).__name__}")
    unknown = set(raw) - {"apiVersion", "kind", "metadata", "spec"}
    if unknown:
        shown = ", ".join(sorted(unknown))
        raise PodTemplateError(f"unknown field(s) {shown}; accepted: apiVersion, kind, metadata, spec")
    if raw.get("kind", "Pod") != "Pod":
        raise PodTemplateError(f"kind must be Pod, got {raw.get('kind')!r}")
    manifest = copy.deepcopy(dict(raw))
    spec_given = isinstance(manifest.get("spec"), Mapping)
    containers_given = spec_given and bool(manifest["spec"].get("containers"))
    for container in manifest["spec"].get("containers") or [] if spec_given else []:
        if isinstance(container, dict):
            container.setdefault("name", _PLACEHOLDER)  # the job's container: its name is the backend's
    try:
        pod = _to_pod(_with_container(manifest))
    except (ValueError, TypeError, AttributeError) as error:
        raise PodTemplateError(f"{_culprit(manifest)}not a valid Pod: {error}") from None
    normal = _to_dict(pod)
    if spec_given and not containers_given:
        del normal["spec"]["containers"]
    _check_known_fields(raw, normal, "")
    spec = normal.get("spec") or {}
    containers = spec.get("containers") or []
    if len(containers) > 1:
        raise PodTemplateError(
            "spec.containers: at most one container (merged into the job's); a second one would keep the Job "
            "from completing (use spec.initContainers)"
        )
    for field in _BACKEND_POD_FIELDS:
        if field in spec:
            raise PodTemplateError(
                f"spec.{field}: set by the backend (the band's PriorityClass from priority_classes, which capacity "
                f"counts by; the replicas' names the rendezvous resolves); the template may not set "
                f"{', '.join(_BACKEND_POD_FIELDS)}"
            )
    for volume in spec.get("volumes") or []:
        if volume.get("name") in RESERVED_VOLUMES:
            raise PodTemplateError(
                f"spec.volumes: the name {volume['name']!r} is the backend's; reserved: {', '.join(RESERVED_VOLUMES)}"
            )
    for container in containers:
        for field in _BACKEND_CONTAINER_FIELDS:
            if field in container:
                raise PodTemplateError(
                    f"spec.containers[0].{field}: set by the backend from the job; the template may not set "
                    f"{', '.join(_BACKEND_CONTAINER_FIELDS)}"
                )
        for mount in container.get("volumeMounts") or []:
            path = str(mount.get("mountPath", "")).rstrip("/")
            if any(path == reserved or path.startswith(reserved + "/") for reserved in RESERVED_MOUNTS):
                raise PodTemplateError(
                    f"spec.containers[0].volumeMounts: {path} is the backend's; reserved: {', '.join(RESERVED_MOUNTS)}"
                )
        for entry in container.get("env") or []:
            name = str(entry.get("name", ""))
            if name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV:
                raise PodTemplateError(
                    f"spec.containers[0].env: {name} is the backend's (the {RESERVED_ENV_PREFIX}* variables and "
                    f"{', '.join(sorted(RESERVED_ENV))})"
                )
    return normal


def merged_pod_template(generated: Mapping[str, Any], template: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Job's pod template (``{"metadata", "spec"}`` as ``manifests.py`` builds it) with the
    backend's ``template`` merged in, by the precedence of this module's docstring."""
    if not template:
        return dict(generated)
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    ours = _to_pod(dict(generated))
    theirs = _to_pod(_with_container(copy.deepcopy(dict(template))))
    # The env is merged here (the template's wins); the provider's merge would concatenate it.
    their_env = _container_env(theirs)
    _set_container_env(theirs, [])
    merged = _to_dict(PodGenerator.reconcile_pods(theirs, ours))
    spec = merged["spec"]
    generated_spec = generated.get("spec", {})
    container = spec["containers"][0]
    generated_container = generated_spec["containers"][0]
    for field in _BACKEND_CONTAINER_FIELDS:  # exactly the backend's, present or not
        container.pop(field, None)
        if field in generated_container:
            container[field] = copy.deepcopy(generated_container[field])
    names = {entry["name"] for entry in their_env}
    env = their_env + [entry for entry in generated_container.get("env", []) if entry["name"] not in names]
    if env:
        container["env"] = env
    spec["restartPolicy"] = generated_spec.get("restartPolicy", "Never")
    tolerations = [*(generated_spec.get("tolerations") or []), *(template.get("spec", {}).get("tolerations") or [])]
    if tolerations:
        spec["tolerations"] = _unique(tolerations)
    # The provider's merge keeps one side's nodeSelector whole: keep both, ours (a TPU slice's labels) winning.
    selector = {**(template.get("spec", {}).get("nodeSelector") or {}), **(generated_spec.get("nodeSelector") or {})}
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": merged.get("metadata", {}), "spec": spec}


def _culprit(manifest: dict[str, Any]) -> str:
    """``"spec.<field>: "`` of the first field of ``manifest`` the client's models cannot take alone."""
    for part in ("metadata", "spec"):
        for key, value in (manifest.get(part) or {}).items() if isinstance(manifest.get(part), Mapping) else ():
            try:
                _to_pod(_with_container({part: {key: value}}))
            except (ValueError, TypeError, AttributeError):
                return f"{part}.{key}: "
    return ""


def _with_container(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Pod API requires a container; a template need not give one (it adds to the job's)."""
    spec = manifest.get("spec")
    if isinstance(spec, Mapping) and not spec.get("containers"):
        manifest["spec"] = {**spec, "containers": [{"name": _PLACEHOLDER}]}
    return manifest


def _container_env(pod: Any) -> list[dict[str, Any]]:
    containers = pod.spec.containers if pod.spec else None
    if not containers:
        return []
    env: list[dict[str, Any]] = _to_dict(containers[0]).get("env") or []
    return env


def _set_container_env(pod: Any, env: list[Any]) -> None:
    if pod.spec and pod.spec.containers:
        pod.spec.containers[0].env = env or None


def _unique(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _to_pod(manifest: dict[str, Any]) -> Any:
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    return PodGenerator.deserialize_model_dict(manifest)


def _to_dict(model: Any) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    result: dict[str, Any] = ApiClient().sanitize_for_serialization(model)
    return result


def _check_known_fields(raw: Any, normal: Any, path: str) -> None:
    """Every key of ``raw`` survived the round trip through the client's models (``normal``) with
    its shape: the client drops an unknown key and splits a string given for a list, silently."""
    where = path or "the template"
    if isinstance(raw, Mapping):
        if not isinstance(normal, Mapping):
            raise PodTemplateError(f"{where}: must not be a mapping")
        for key, value in raw.items():
            inner = f"{path}.{key}" if path else str(key)
            if key not in normal:
                if value is None:
                    continue  # a null field: nothing lost
                raise PodTemplateError(f"{inner}: not a field of a Kubernetes Pod (check its spelling and place)")
            # A map of free-form keys (labels, nodeSelector, ...) is kept as is by the client.
            _check_known_fields(value, normal[key], inner)
    elif isinstance(raw, list):
        if not isinstance(normal, list):
            raise PodTemplateError(f"{where}: must not be a list")
        for index, (item, kept) in enumerate(zip(raw, normal, strict=False)):
            _check_known_fields(item, kept, f"{path}[{index}]")
    elif isinstance(normal, Mapping):
        raise PodTemplateError(f"{where}: must be a mapping, got {raw!r}")
    elif isinstance(normal, list):
        raise PodTemplateError(f"{where}: must be a list, got {raw!r}")

"""Job trees: the rules for a child job a running job submits (the seed's "Only whole root jobs are
federated ... a job tree lives entirely on one cluster").

- A child's id names its parent: ``<parent id>/<name>``, one segment more than its parent.
- It runs on its root's cluster and never federates: the router refuses a non-root job that would
  queue for a peer, naming ``target_cluster`` on the root as the remedy (``core/router.py``).
- It inherits its parent's region unless it names regions itself (``regions`` or a ``region``
  constraint); ``regions: ["*"]`` suppresses the inheritance and is then dropped, so nothing
  further (not the cluster's ``default_region`` either) gives it one.
- It inherits its parent's env, its own env winning.
- Its submitter is its root's accountable user (see :func:`child_submitter`).
- A child never outlives its parent (:func:`orphan_reason`).

Where the store keeps a job (its key) may differ from its id: a peer keeps a received root under
``<requester>:<job id>``. Its children live under the same prefix, so every function here works on
keys and ids alike: a parent's key is its child's key less the last segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iris_airflow_provider.core.constraints import ANY_REGION
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.job_ids import job_id_problem
from iris_airflow_provider.core.model import JobSpec, parse_job
from iris_airflow_provider.core.states import JobState

# What a child may not set: where it runs is its root's cluster, and its id comes from its parent.
_NOT_FOR_CHILDREN = {
    "parent_job_id": "is set from the submitting job; leave it out",
}


def parent_key(key: str) -> str | None:
    """The key of the job ``key`` is a child of, or None for a root (``/<user>/<name>``)."""
    path = key[1:] if key.startswith("/") else key.partition(":/")[2]
    if path.count("/") < 2:
        return None
    return key.rpartition("/")[0]


def root_key(key: str) -> str:
    """The key of the root of ``key``'s tree (``key`` itself for a root)."""
    parent = parent_key(key)
    while parent is not None:
        key, parent = parent, parent_key(parent)
    return key


def is_descendant(key: str, ancestor: str) -> bool:
    """Whether ``key`` is in the tree below ``ancestor`` (not ``ancestor`` itself)."""
    return key.startswith(ancestor + "/")


def child_job_id(parent_job_id: str, name: str) -> str:
    """The id of ``parent_job_id``'s child ``name``: a bare segment, or the full id, which must then
    be exactly one level below the parent. :class:`SpecError` on ``job_id`` otherwise."""
    if name.startswith("/"):
        if name.rpartition("/")[0] != parent_job_id:
            raise SpecError.single(
                "job_id",
                f"a child's id is <parent>/<name>, one level below the job submitting it: "
                f"{parent_job_id}/<name>, got {name[:600]!r}",
            )
        child = name
    else:
        if not name or "/" in name:
            raise SpecError.single(
                "job_id", f"must be the child's name (one segment, no '/') or {parent_job_id}/<name>, got {name!r}"
            )
        child = f"{parent_job_id}/{name}"
    problem = job_id_problem(child)
    if problem is not None:
        raise SpecError.single("job_id", f"the child id {child[:600]!r} is not a valid job id: {problem}")
    return child


def _names_region(document: Mapping[str, Any]) -> bool:
    if document.get("regions") is not None:
        return True
    constraints = document.get("constraints") or ()
    return any(isinstance(c, Mapping) and c.get("key") == "region" for c in constraints)


def _parent_region(parent: JobSpec) -> dict[str, Any]:
    """The fields that give a child its parent's region (empty when the parent has none)."""
    if parent.regions and parent.regions != (ANY_REGION,):
        return {"regions": list(parent.regions)}
    for constraint in parent.constraints:
        if constraint.key == "region":
            return {"constraints": [constraint.model_dump(mode="json")]}
    return {}


def child_spec(parent: JobSpec, document: Mapping[str, Any]) -> JobSpec:
    """The child job ``parent`` submits as ``document`` (a job document whose ``job_id`` is the
    child's name or full id), with what it inherits from ``parent`` applied.

    :class:`SpecError` names every bad field, as for any job.
    """
    if not isinstance(document, Mapping):
        raise SpecError.single("job", f"must be a job object, got {type(document).__name__}")
    for field, message in _NOT_FOR_CHILDREN.items():
        if field in document:
            raise SpecError.single(field, message)
    name = document.get("job_id")
    if not isinstance(name, str):
        raise SpecError.single("job_id", "is required: the child's name (one segment), or <parent>/<name>")
    fields = dict(document)
    fields["job_id"] = child_job_id(parent.job_id, name)
    env = fields.get("env") or {}
    if not isinstance(env, Mapping):
        raise SpecError.single("env", f"must be an object of NAME: value, got {type(env).__name__}")
    fields["env"] = {**parent.env, **env}  # its own env wins
    if not _names_region(document):
        inherited = _parent_region(parent)
        if "constraints" in inherited:
            fields["constraints"] = [*(fields.get("constraints") or ()), *inherited["constraints"]]
        elif inherited:
            fields["regions"] = inherited["regions"]
    spec = parse_job(fields)
    if spec.regions == (ANY_REGION,):
        # The opt-out did its work (no inherited region); it goes no further.
        spec = spec.model_copy(update={"regions": None})
    return spec


def child_submitter(root_submitting_user: str, root_owner_principal: str) -> tuple[str, str]:
    """Who a child is submitted as: its root's accountable user (and the principal its root was
    handed over under), never the job itself nor an in-cluster identity."""
    return root_submitting_user, root_owner_principal or root_submitting_user


def orphan_reason(parent: str, state: JobState | None, *, cancel_requested: bool) -> str | None:
    """Why a live child of ``parent`` must be killed now (None: its parent is live and keeps it).

    ``state``: the parent's state (None: the parent is gone from the store)."""
    if state is None:
        return f"Its parent job {parent} no longer exists: a child never outlives its parent"
    if state.terminal:
        return f"Its parent job {parent} ended ({state.value}): a child never outlives its parent"
    if cancel_requested:
        return f"Its parent job {parent} was cancelled: cancelling a job cancels its whole tree"
    return None

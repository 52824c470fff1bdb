"""Who a job id belongs to, and who may use it.

A job id is owned by what created it: the DAG and task that submitted it and their accountable
user. Job ids are namespaced by that user: ``/<user>/<name>``; a bare name is placed under the
submitter's namespace, and an id under anyone else's is refused. Within one user's namespace the
owner is the DAG and task too, so one DAG's task cannot take over another's job. A submit that
names an existing job reattaches to it (or, once it has finished, runs it again) only for its
owner; anyone else is told the id is taken, and nothing about the job behind it.

Received jobs (handed over by a peer) live under their requester's own namespace,
``<peer>:<job id>``, so one peer's ids never meet another's or this cluster's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from iris_airflow_provider.core.job_ids import user_segment

UNATTRIBUTED = "airflow"  # the namespace of runs with no accountable user (scheduled, no submitter)
RECEIVED_SEPARATOR = ":"


class OwnershipError(ValueError):
    """A submit named a job id its submitter may not use; the message names the rule, not the job."""


@dataclass(frozen=True, slots=True)
class Owner:
    """What owns a job: the submitting DAG and task, and the accountable user ("" for none)."""

    dag_id: str
    task_id: str
    user: str


def user_namespace(user: str) -> str:
    """The first segment of the job ids ``user`` may use (characters the id rule refuses become ``_``)."""
    return user_segment(user) if user else UNATTRIBUTED


def qualified_job_id(job_id: str, user: str) -> str:
    """``job_id`` as a full id: a bare name (no leading ``/``) goes under ``user``'s namespace."""
    return job_id if job_id.startswith("/") else f"/{user_namespace(user)}/{job_id}"


def check_namespace(job_id: str, user: str) -> None:
    """Refuse a job id outside ``user``'s namespace, naming the rule and the accepted form."""
    namespace = user_namespace(user)
    first = job_id.split("/")[1] if job_id.startswith("/") and job_id.count("/") >= 2 else ""
    if first != namespace:
        raise OwnershipError(
            f"job_id {job_id!r} is outside the submitter's namespace: job ids are /{namespace}/<name> "
            f"(or a bare <name>, placed there) for submitter {user or '(none: ' + UNATTRIBUTED + ')'}"
        )


def may_claim(owner: Owner | None, claimant: Owner) -> bool:
    """Whether ``claimant`` may reattach to or re-run the job ``owner`` owns (None: an owner we do not
    know, e.g. a job admitted before owners were recorded: nobody may claim it)."""
    return owner == claimant


def taken(job_id: str) -> OwnershipError:
    """The refusal for a job id owned by someone else: names the conflict and the remedy, nothing more."""
    return OwnershipError(f"job_id {job_id} is already used by another DAG, task or user; give this job another job_id")


def service_principal_allowed(principal: str, dag_id: str, service_principals: Mapping[str, Sequence[str]]) -> bool:
    """Whether a DAG may submit as ``principal`` (an explicit ``submitter``): only where the cluster
    file lists the principal with a glob over DAG ids that matches ``dag_id``."""
    return any(fnmatchcase(dag_id, pattern) for pattern in service_principals.get(principal, ()))


def service_principal_refused(principal: str, dag_id: str) -> str:
    """Why an explicit submitter was refused, and the remedy."""
    return (
        f"submitter {principal!r} is not allowed for DAG {dag_id!r}: an explicit submitter must be listed in the "
        f"cluster file's federation.service_principals with a pattern matching the DAG id "
        f"({{{principal!r}: [{dag_id!r}]}}); runs triggered by a logged-in user need no submitter"
    )


def received_job_key(requester: str, job_id: str) -> str:
    """Where this cluster keeps a job ``requester`` handed it: ``<requester>:<job id>``."""
    return f"{requester}{RECEIVED_SEPARATOR}{job_id}"


def wire_job_id(requester: str, key: str) -> str:
    """The job id ``requester`` knows a received job by (the key without its namespace)."""
    return key.removeprefix(f"{requester}{RECEIVED_SEPARATOR}")

"""Child jobs: what a running job may do with its cluster, authenticated by its job token alone.

A job submits children (``core/job_tree.py`` says what they inherit and where they may run), reads
their state and cancels them. It acts on its own tree only: a token names one incarnation of one
job, and a child id outside that job's tree is refused as if it were someone else's, which it is.
A token of an incarnation that has ended or was replaced is refused, even before it expires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from iris_airflow_provider.core.job_tree import child_spec, child_submitter, is_descendant, root_key
from iris_airflow_provider.core.router import Disposition
from iris_airflow_provider.core.states import Direction, JobState
from iris_airflow_provider.services.cancel import CancelAnswer, Cancels
from iris_airflow_provider.services.job_tokens import JobTokenError, JobTokens
from iris_airflow_provider.services.ports import JobReads
from iris_airflow_provider.services.submit import Submitted, Submitter
from iris_airflow_provider.store.records import JobRecord, NewIncarnation
from iris_airflow_provider.store.trees import ChildAdmission


class ChildStore(JobReads, Protocol):
    def admit_child(self, new: NewIncarnation, parent_key: str, parent_nonce: str, now_ms: int) -> ChildAdmission: ...

    def tree(self, key: str) -> list[JobRecord]: ...

    def job_result(self, job_id: str, nonce: str) -> str | None: ...


class NotInTreeError(PermissionError):
    """A job named a job outside its own tree."""


@dataclass(eq=False)  # a service, compared by identity
class ChildJobs:
    store: ChildStore
    _: KW_ONLY
    tokens: JobTokens
    submitter: Submitter
    cancels: Cancels
    clock: Callable[[], int]

    def caller(self, authorization: str | None) -> JobRecord:
        """The live job incarnation whose token ``authorization`` carries; JobTokenError otherwise."""
        identity = self.tokens.verify(authorization)
        job = self.store.get_job(identity.job_key)
        if job is None or job.nonce != identity.nonce:
            raise JobTokenError(f"the incarnation of job {identity.job_key} this token was issued to was replaced")
        if job.terminal:
            raise JobTokenError(f"job {identity.job_key} has ended ({job.state.value}): its token is no longer valid")
        return job

    def renew(self, caller: JobRecord) -> str:
        return self.tokens.mint(caller.job_id, caller.nonce)

    def submit(self, caller: JobRecord, document: Mapping[str, Any]) -> Submitted:
        """Submit a child of ``caller`` here (SpecError for a bad field, ParentNotLiveError when the
        caller is ending). A child that cannot run on this cluster is rejected, never queued."""
        spec = child_spec(caller.job_spec, document)
        key = self._key(caller, spec.job_id)
        root = self.store.get_job(root_key(caller.job_id))
        user, principal = child_submitter(
            root.submitting_user if root else caller.submitting_user,
            root.owner_principal if root else caller.owner_principal,
        )
        decision = self.submitter.classify(spec)  # a child that would queue for a peer is rejected there
        if decision.disposition is not Disposition.LOCAL:
            return Submitted(decision, None)
        new = NewIncarnation(
            spec,
            direction=Direction.LOCAL,
            submitting_user=user,
            owner_principal=principal,
            backend_id=decision.local_backend_id,
            key=key if key != spec.job_id else "",
        )
        admission = self.store.admit_child(new, caller.job_id, caller.nonce, self.clock())
        if admission.created:
            self.submitter.start_local(admission.job, spec)
        return Submitted(decision, self.store.get_job(key) or admission.job, reattached=not admission.created)

    def child(self, caller: JobRecord, child_id: str) -> JobRecord:
        """A job of ``caller``'s tree, by its id or its name under ``caller``; NotInTreeError (which
        says nothing about whether it exists) when it is not in that tree, KeyError when it is not there."""
        key = self._key(caller, child_id)
        if not is_descendant(key, caller.job_id):
            raise NotInTreeError(f"job {child_id[:600]!r} is not in the tree of job {caller.job_spec.job_id}")
        job = self.store.get_job(key)
        if job is None:
            raise KeyError(f"job {child_id} has not been submitted")
        return job

    def tree(self, caller: JobRecord) -> list[JobRecord]:
        return self.store.tree(caller.job_id)

    def result(self, job: JobRecord) -> str | None:
        """What ``job`` handed back at ``$IRIS_RESULT`` (JSON text), once it succeeded."""
        return self.store.job_result(job.job_id, job.nonce) if job.state is JobState.SUCCEEDED else None

    def cancel(self, caller: JobRecord, child_id: str) -> CancelAnswer:
        """Cancel a job of ``caller``'s tree, and its own tree."""
        return self.cancels.cancel_with_answer(self.child(caller, child_id).job_id)

    @staticmethod
    def _key(caller: JobRecord, job_id: str) -> str:
        """Where the store keeps ``job_id`` of ``caller``'s tree (a bare name: ``caller``'s child);
        under a peer's namespace when ``caller`` was handed over (``<requester>:<job id>``)."""
        spec_id = caller.job_spec.job_id
        if not job_id.startswith("/"):
            job_id = f"{spec_id}/{job_id}"
        namespace = caller.job_id.removesuffix(spec_id)
        return namespace + job_id

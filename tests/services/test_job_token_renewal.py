"""The tick's token renewal (``renew_token_files``) across backends: a backend that can tell which
tokens are due is written those alone, from one question for all its jobs; one that cannot is
written every live job's; a backend that cannot be asked or written now is left for the next tick,
and the others are still renewed. (Each backend's own side is in the contract suite.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import jwt

from iris_airflow_provider.core.states import Direction
from iris_airflow_provider.services.job_tokens import TOKEN_TTL_SECONDS, JobTokens, renew_token_files

NOW = 1_800_000_000.0
TOKENS = JobTokens("marin", b"job-token-key-of-marin-for-tests!", federation_url="http://x", clock=lambda: NOW)


class FileBackend:
    """Keeps tokens in files: cannot tell which are due."""

    def __init__(self, fails: bool = False) -> None:
        self.written: dict[tuple[str, str], str] = {}
        self.fails = fails

    def write_job_token(self, job_id: str, nonce: str, token: str) -> bool:
        if self.fails:
            raise ConnectionError("API down")
        self.written[(job_id, nonce)] = token
        return True


class SecretBackend(FileBackend):
    """Keeps tokens where one question tells which are due (as the Kubernetes backend's Secrets)."""

    def __init__(self, expiries: dict[tuple[str, str], int], fails: bool = False) -> None:
        super().__init__()
        self.expiries = expiries
        self.asked: list[list[tuple[str, str]]] = []
        self.listing_fails = fails

    def job_tokens_due(self, live: Iterable[tuple[str, str]], due: Callable[[int], bool]) -> set[tuple[str, str]]:
        if self.listing_fails:
            raise ConnectionError("API down")
        self.asked.append(list(live))
        return {key for key in self.asked[-1] if key in self.expiries and due(self.expiries[key])}


def job(job_id: str, backend: str, *, terminal: bool = False, direction: Direction = Direction.LOCAL) -> Any:
    return SimpleNamespace(job_id=job_id, nonce=f"{job_id}-n", terminal=terminal, direction=direction, backend=backend)


def test_only_due_tokens_are_written_where_the_backend_can_tell_and_all_elsewhere() -> None:
    fresh, half_spent = int(NOW) + TOKEN_TTL_SECONDS, int(NOW) + TOKEN_TTL_SECONDS // 2 - 1
    secrets = SecretBackend({("a", "a-n"): fresh, ("b", "b-n"): half_spent})
    files = FileBackend()
    backends = {"kube": secrets, "proc": files}
    jobs = [
        job("a", "kube"),
        job("b", "kube"),
        job("c", "kube"),  # not created there yet: no Secret
        job("d", "kube", terminal=True),
        job("e", "kube", direction=Direction.SENT),  # runs on a peer, which renews its own
        job("f", "proc"),
    ]
    assert renew_token_files(TOKENS, jobs, lambda j: backends[j.backend]) == 2
    assert secrets.asked == [[("a", "a-n"), ("b", "b-n"), ("c", "c-n")]]  # one question for all its jobs
    assert set(secrets.written) == {("b", "b-n")}
    assert set(files.written) == {("f", "f-n")}
    claims = jwt.decode(secrets.written[("b", "b-n")], options={"verify_signature": False})
    assert (claims["sub"], claims["nonce"], claims["exp"]) == ("b", "b-n", int(NOW) + TOKEN_TTL_SECONDS)


def test_a_backend_that_cannot_be_asked_or_written_now_does_not_stop_the_others() -> None:
    down, unwritable, files = SecretBackend({}, fails=True), FileBackend(fails=True), FileBackend()
    backends = {"down": down, "unwritable": unwritable, "proc": files, "none": None}
    jobs = [job("a", "down"), job("b", "unwritable"), job("c", "proc"), job("d", "none")]
    assert renew_token_files(TOKENS, jobs, lambda j: backends[j.backend]) == 1
    assert set(files.written) == {("c", "c-n")} and not down.written

"""Helpers of the process backend's tests: specs, submissions, release files, process checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iris_airflow_provider.backends.base import Submission, SubmitOutcome
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core.model import JobSpec, parse_job


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie no longer runs; its parent may simply not reap it


def job_spec(
    job_id: str = "/alice/job",
    command: str | list[str] = "true",
    *,
    gpus: int = 0,
    variant: str = "h100",
    device: str = "gpu",
    replicas: int = 1,
    band: str = "interactive",
    env: dict[str, str] | None = None,
    files: dict[str, str] | None = None,
) -> JobSpec:
    resources: dict[str, Any] = {"replicas": replicas}
    if gpus:
        resources["device"] = {"type": device, "variant": variant, "count": gpus}
    return parse_job(
        {
            "job_id": job_id,
            "command": command,
            "resources": resources,
            "priority_band": band,
            "env": env or {},
            "files": files or {},
        }
    )


def submit(
    backend: ProcessBackend, spec: JobSpec, nonce: str = "n1", *, at: int = 1_000, requester: str = ""
) -> SubmitOutcome:
    return backend.submit(Submission(spec.job_id, nonce, spec, requester, at))


class Gates:
    """Release files: ``held(name)`` is a command that waits until ``release(name)`` is called."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.directory / name

    def held(self, name: str, before: str = "") -> str:
        prefix = f"{before}; " if before else ""
        return f"{prefix}while [ ! -e {self.path(name)} ]; do sleep 0.02; done"

    def release(self, name: str) -> None:
        self.path(name).touch()


def gpu_backend(state_dir: Path, slots: int = 4, **kwargs: Any) -> ProcessBackend:
    return ProcessBackend("gpu", state_dir, devices={"h100": slots}, **kwargs)


def log_lines(backend: ProcessBackend, job_id: str) -> list[str]:
    return list(backend.logs(job_id).lines)


def status_file(state_dir: Path, job_id: str) -> Path:
    backend = ProcessBackend.from_state_dir(state_dir)
    return backend._directory(job_id) / "status.json"

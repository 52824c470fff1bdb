"""Operating-system processes of the process backend: launching a job's detached supervisor,
telling whether it (or what it started) still runs, and signalling a job's process group.

Linux only: liveness is read from ``/proc``, so that a recycled pid is not mistaken for ours.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

# Environment a job starts from: enough to find programs, nothing that could carry a credential.
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")
# The supervisor's own environment: what Python needs to start, nothing more. A job can read its
# parent's (the supervisor's) environment through /proc, so the caller's credentials must not be in it.
SUPERVISOR_ENV_KEYS = (*BASE_ENV_KEYS, "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")
SUPERVISOR_MODULE = "iris_airflow_provider.backends.process.supervisor"


def base_environment() -> dict[str, str]:
    """The part of this process's environment a job may start from."""
    return {key: os.environ[key] for key in BASE_ENV_KEYS if key in os.environ}


def spawn_supervisor(state_dir: Path, job_directory: str) -> int:
    """Start the job's supervisor fully detached (double fork, own session); return its pid."""
    launcher = subprocess.run(
        [sys.executable, "-m", SUPERVISOR_MODULE, str(state_dir), job_directory],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
        timeout=60,
        close_fds=True,
        env={key: os.environ[key] for key in SUPERVISOR_ENV_KEYS if key in os.environ},
    )
    return int(launcher.stdout.decode().strip())


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks, so a recycled pid is not mistaken for our supervisor."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` runs (not a zombie) and is the process that started at ``start`` (if known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
    except OSError:
        return False
    return start is None or start_time(pid) == start


def job_group_alive(pgid: int | None, nonce: str) -> bool:
    """Whether processes of this job incarnation still run in its process group.

    The group id is the dead supervisor's pid, which may have been recycled (after a reboot, say):
    only a process carrying the incarnation's ``IRIS_JOB_NONCE`` proves the group is still ours.
    """
    if pgid is None:
        return False
    marker = f"IRIS_JOB_NONCE={nonce}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pgid:
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def signal_group(pgid: int | None, sig: int) -> None:
    """Send ``sig`` to the process group, if there is one (a group already gone is fine)."""
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)

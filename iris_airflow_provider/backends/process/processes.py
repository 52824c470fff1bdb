"""Operating-system processes of the process backend: launching a job's detached supervisor,
telling whether it still runs, signalling a job's process group, and killing what is left in a
job's session (the supervisor's, which every replica and its children inherit).

Linux only: liveness is read from ``/proc``, so that a recycled pid is not mistaken for ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

# Environment a job starts from: enough to find programs, nothing that could carry a credential.
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")
# The supervisor's own environment: what Python needs to start, nothing more. A job can read its
# parent's (the supervisor's) environment through /proc, so the caller's credentials must not be in it.
SUPERVISOR_ENV_KEYS = (*BASE_ENV_KEYS, "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")
SUPERVISOR_MODULE = "iris_airflow_provider.backends.process.supervisor"
KILL_PASSES = 50


def base_environment() -> dict[str, str]:
    """The part of this process's environment a job may start from."""
    return {key: os.environ[key] for key in BASE_ENV_KEYS if key in os.environ}


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick), as torch's launcher finds one: another
    process could take it before the job binds it, which the job then reports as a failure to listen."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


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


def boot_id() -> str | None:
    """This boot of the machine: process ids and start times mean nothing across a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` that still run (zombies have ended).

    A session is what a job cannot leave by accident or by setting its environment: every process
    its replicas start inherits it, whatever group it moves to, and only a process that calls
    ``setsid(2)`` itself (daemonizing on purpose) leaves it; only a cgroup would contain that.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
                members.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return members


def kill_session(sid: int, *, spare: int | None = None) -> None:
    """SIGKILL every process of session ``sid`` but ``spare``, pass after pass until none is left
    (a process forking as it is killed leaves a child the next pass finds); bounded, as a process
    stuck in the kernel may take a while to die."""
    for _ in range(KILL_PASSES):
        members = [pid for pid in session_members(sid) if pid != spare]
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def reap_orphaned_session(sid: int | None, supervisor_start: int | None, boot: str | None) -> None:
    """Kill what is left of a job whose supervisor died: every process still in its session.

    The session id is the dead supervisor's pid. The kernel does not hand that number to a new
    process while any member of the session lives, so if a process other than our (zombie)
    supervisor now has it, the session had emptied: nothing of ours is left to kill. After a
    reboot, nothing is.
    """
    if sid is None or (boot is not None and boot != boot_id()):
        return
    leader_start = start_time(sid)
    if leader_start is not None and supervisor_start is not None and leader_start != supervisor_start:
        return
    kill_session(sid)


def signal_group(pgid: int | None, sig: int) -> None:
    """Send ``sig`` to the process group, if there is one (a group already gone is fine)."""
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)

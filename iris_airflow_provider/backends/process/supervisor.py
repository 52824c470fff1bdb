"""The detached supervisor of one process-backend job: ``python -m ...backends.process.supervisor STATE_DIR JOB_DIR``.

The command returns at once, printing the supervisor's pid; the supervisor itself runs in its own
session (so it outlives whoever started it and a signal to its process group reaches every
replica), starts one subprocess per replica, writes each exit code as it comes, stops the others
when one fails, kills whatever is left in its session once they have all ended, and reports the
end to the backend, which then starts queued work. The session is how the backend finds a job's
processes when this supervisor is killed: every replica and its children inherit it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    state_dir, job_directory = Path(argv[1]), argv[2]
    read_end, write_end = os.pipe()
    if os.fork():  # the launcher: wait for the grandchild's pid, print it, leave
        os.close(write_end)
        pid = os.read(read_end, 64).decode()
        print(pid, flush=True)
        return 0 if pid else 1
    os.close(read_end)
    if os.fork():  # the intermediate: exit so the supervisor is adopted by init
        os._exit(0)
    os.setsid()
    os.write(write_end, str(os.getpid()).encode())
    os.close(write_end)
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(state_dir / "jobs" / job_directory / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        supervise(state_dir, job_directory)
    except BaseException:  # the backend settles the job as failed once it sees this process gone
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)


def supervise(state_dir: Path, job_directory: str) -> None:
    from iris_airflow_provider.backends.process import processes
    from iris_airflow_provider.backends.process.backend import KILL_GRACE_SECONDS, ProcessBackend
    from iris_airflow_provider.backends.process.environment import replica_environment
    from iris_airflow_provider.backends.process.state import load_job

    backend = ProcessBackend.from_state_dir(state_dir)
    directory = state_dir / "jobs" / job_directory
    loaded = load_job(directory)
    if loaded is None:
        raise FileNotFoundError(f"no job in {directory}")
    job, status = loaded.record, loaded.status
    devices = status.devices
    command = job.command
    replicas = job.replicas

    stopping: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))

    exit_codes: list[int | None] = [None] * replicas
    error = ""
    failed_replica: int | None = None  # the first to fail: its code is the job's
    children: dict[int, subprocess.Popen[bytes]] = {}
    if not command:
        error, exit_codes = "The job has no command to run", [127] * replicas
    # Where replica 0 listens for the others (MASTER_PORT): free now, on loopback, for this run.
    coordinator_port = processes.free_loopback_port()
    for index in range(replicas if command else 0):
        with (directory / f"replica-{index}.log").open("ab") as output:
            try:
                children[index] = subprocess.Popen(
                    command,
                    cwd=directory / "workdir",
                    env=replica_environment(
                        job,
                        index,
                        devices,
                        coordinator_port,
                        status.ports[index] if status.ports else None,
                        backend.settings(),
                        directory,
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            except OSError as exc:
                error = f"Replica {index} could not start {command[0]!r}: {exc.strerror}"
                exit_codes[index] = 127
                failed_replica = index
                break

    terminated: set[int] = set()  # told to stop once: a child shutting down gracefully is left to it

    def stop_all(sig: int) -> None:
        for index, child in children.items():
            if child.poll() is None and (sig != signal.SIGTERM or index not in terminated):
                child.send_signal(sig)
                terminated.add(index)

    if error:
        stop_all(signal.SIGTERM)
    while any(child.poll() is None for child in children.values()):
        for index, child in children.items():
            code = child.poll()
            if code is not None and exit_codes[index] is None:
                exit_codes[index] = code
                (directory / f"replica-{index}.exit").write_text(str(code))
                if code != 0 and not error:
                    error = f"Replica {index} exited with code {code}"
                    failed_replica = index
                    stop_all(signal.SIGTERM)
                    stopping.append(time.monotonic())
        if stopping:
            stop_all(signal.SIGTERM)
            if time.monotonic() - stopping[0] > KILL_GRACE_SECONDS:
                stop_all(signal.SIGKILL)
        time.sleep(0.1)
    for index, child in children.items():
        if exit_codes[index] is None:
            exit_codes[index] = child.returncode
            (directory / f"replica-{index}.exit").write_text(str(child.returncode))
    # What the replicas started and left behind (a background process, a daemon that changed its
    # process group) ends with the job: it would otherwise hold devices the backend now frees.
    processes.kill_session(os.getsid(0), spare=os.getpid())
    if not error:
        failed = [(i, code) for i, code in enumerate(exit_codes) if code != 0]
        if failed:
            error = f"Replica {failed[0][0]} exited with code {failed[0][1]}"
            failed_replica = failed[0][0]
    backend.supervisor_finished(job.job_id, exit_codes, error, failed_replica, nonce=job.nonce, attempt=status.attempts)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

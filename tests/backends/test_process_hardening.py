"""Issue 11 against the process backend: a failed materialization leaves nothing behind, and a job's
processes are found by its session, which nothing in the job's spec or environment can change.

Everything here runs real processes; a supervisor is killed with a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core.model import JobSpec
from iris_airflow_provider.core.states import JobState
from tests.backends.process_helpers import gpu_backend, job_spec, log_lines, process_gone, status_file, submit
from tests.waiting import wait_for, wait_state

# A process that does what a job can do to hide from a reaper that looks at environments or
# process groups: it drops IRIS_JOB_NONCE from its environment and moves to a group of its own.
ESCAPE = """
import os, sys
os.setpgid(0, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(os.getpid()))
os.execvp("sleep", ["sleep", "60"])
"""


def pid_in(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), f"{path.name} to be written")
    return int(path.read_text())


def escaping_command(pids: Path) -> str:
    return f"env -u IRIS_JOB_NONCE {sys.executable} escape.py {pids}/escaper & echo $$ > {pids}/replica; wait"


# A failed materialization leaves nothing behind ---------------------------------------------------------


def unwritable(job_id: str) -> JobSpec:
    """A spec whose files cannot be written (``a`` a file and a directory at once). The model refuses
    it; built past the model here, it stands for any write that fails half way (a full disk, say)."""
    valid = job_spec(job_id, "cat a/b", files={"x": "1"})
    return valid.model_copy(update={"files": {"a": "a file", "a/b": "in a directory a"}})


def test_a_failed_materialization_leaves_nothing_and_the_job_id_stays_usable(state_dir: Path) -> None:
    backend = ProcessBackend("cpu", state_dir)
    with pytest.raises(FileExistsError):
        submit(backend, unwritable("/alice/wedged"), "n1")
    assert list((state_dir / "jobs").iterdir()) == []
    assert list((state_dir / "staging").iterdir()) == []
    assert backend.status("/alice/wedged") is None
    assert backend.live_job_ids() == []

    # Once, the directory stayed behind and every later submission failed with FileExistsError.
    spec = job_spec("/alice/wedged", "cat data/greeting.txt", files={"data/greeting.txt": "hello\n"})
    submit(backend, spec, "n2")
    assert wait_state(backend, "/alice/wedged", JobState.SUCCEEDED).nonce == "n2"
    assert log_lines(backend, "/alice/wedged") == ["[replica 0] hello"]


def test_a_failed_replacement_keeps_the_finished_incarnation_it_was_to_replace(state_dir: Path) -> None:
    backend = ProcessBackend("cpu", state_dir)
    submit(backend, job_spec("/alice/nightly", "echo first"), "n1")
    wait_state(backend, "/alice/nightly", JobState.SUCCEEDED)
    with pytest.raises(FileExistsError):
        submit(backend, unwritable("/alice/nightly"), "n2")
    report = backend.status("/alice/nightly")
    assert report is not None and (report.nonce, report.state) == ("n1", JobState.SUCCEEDED)
    assert log_lines(backend, "/alice/nightly") == ["[replica 0] first"]
    submit(backend, job_spec("/alice/nightly", "echo second"), "n3")
    assert wait_state(backend, "/alice/nightly", JobState.SUCCEEDED).nonce == "n3"


def test_a_nonce_from_another_cluster_never_becomes_a_path(state_dir: Path, tmp_path: Path) -> None:
    backend = ProcessBackend("cpu", state_dir)
    submit(backend, job_spec("/alice/again", "true"), "../../../escaped")
    wait_state(backend, "/alice/again", JobState.SUCCEEDED)
    # Retiring that incarnation once named its directory after the nonce: it failed, wedging the id.
    submit(backend, job_spec("/alice/again", "true"), "n2")
    assert wait_state(backend, "/alice/again", JobState.SUCCEEDED).nonce == "n2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backend"]
    assert len(list((state_dir / "jobs").iterdir())) == 2  # both incarnations, side by side


# The reaper finds a job's processes by its session --------------------------------------------------


def test_a_killed_supervisors_processes_are_reaped_even_those_hiding_from_env_and_group(
    state_dir: Path, tmp_path: Path
) -> None:
    backend = gpu_backend(state_dir, 1)
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = job_spec("/alice/escape", escaping_command(pids), gpus=1, files={"escape.py": ESCAPE})
    submit(backend, spec, at=1)
    submit(backend, job_spec("/alice/next", "echo ran", gpus=1), at=2)
    replica, escaper = pid_in(pids / "replica"), pid_in(pids / "escaper")
    environ = Path(f"/proc/{escaper}/environ").read_bytes().split(b"\0")
    assert not any(entry.startswith(b"IRIS_JOB_NONCE=") for entry in environ)
    assert os.getpgid(escaper) != os.getpgid(replica)

    supervisor = json.loads(status_file(state_dir, "/alice/escape").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: process_gone(supervisor), "the supervisor to die")

    report = backend.status("/alice/escape")
    assert report is not None and report.state is JobState.FAILED
    assert report.error == "The job's supervisor process died"
    wait_for(lambda: process_gone(replica) and process_gone(escaper), "every process of the job to be killed")
    # Only then is its device free for the next job.
    wait_state(backend, "/alice/next", JobState.SUCCEEDED)


def test_what_a_job_leaves_running_ends_with_it(state_dir: Path, tmp_path: Path) -> None:
    backend = gpu_backend(state_dir, 1)
    pids = tmp_path / "pids"
    pids.mkdir()
    # The replica starts the escaper, waits for it to be up, and exits: the job succeeds.
    command = escaping_command(pids).replace("; wait", f"; while [ ! -s {pids}/escaper ]; do sleep 0.02; done")
    spec = job_spec("/alice/leaves", command, gpus=1, files={"escape.py": ESCAPE})
    submit(backend, spec)
    escaper = pid_in(pids / "escaper")
    wait_state(backend, "/alice/leaves", JobState.SUCCEEDED)
    # Killed before the end was reported: it would otherwise keep a device the backend now advertises free.
    wait_for(lambda: process_gone(escaper), "the process the job left behind to be killed")


# What a job's environment cannot override ----------------------------------------------------------


def test_a_job_env_cannot_widen_its_devices_or_change_its_identity(state_dir: Path) -> None:
    backend = gpu_backend(state_dir, 4)
    spec = job_spec(
        "/alice/greedy", 'echo "$CUDA_VISIBLE_DEVICES $IRIS_JOB_NONCE"', gpus=1, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    )
    # The model refuses IRIS_* names in a job's env; a spec built past it still cannot set them.
    forged = spec.model_copy(update={"env": {**spec.env, "IRIS_JOB_NONCE": "someone-else"}})
    submit(backend, forged, "n1")
    wait_state(backend, "/alice/greedy", JobState.SUCCEEDED)
    assert log_lines(backend, "/alice/greedy") == ["[replica 0] 0 n1"]

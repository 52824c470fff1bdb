"""How a result leaves a Kubernetes pod: the command wrapper, run here by a real POSIX shell (as the
container's would), the frame it writes, and how the backend reads the frame and relays the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from iris_airflow_provider.backends.kubernetes.logs import LogReader
from iris_airflow_provider.backends.kubernetes.results import (
    RESULT_MARK,
    extract_result,
    is_result_line,
    wrapped_command,
)
from iris_airflow_provider.core.job_result import ResultError


def run_wrapped(command: list[str], result: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "IRIS_RESULT": str(result)}
    return subprocess.run(wrapped_command(command), env=env, capture_output=True, text=True, timeout=60, **kwargs)


def test_the_wrapper_keeps_the_jobs_output_and_exit_code_and_frames_its_result(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    script = 'echo "arg: $1"; printf \'{"loss": 0.5,\\n "note": "a b"}\' > "$IRIS_RESULT"; exit 3'
    done = run_wrapped(["sh", "-c", script, "job", "one two"], result)
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert lines[0] == "arg: one two"
    assert all(is_result_line(line) for line in lines[1:])
    assert json.loads(extract_result(lines) or "") == {"loss": 0.5, "note": "a b"}


def test_without_a_result_file_the_wrapper_adds_nothing(tmp_path: Path) -> None:
    done = run_wrapped(["echo", "hi"], tmp_path / "result.json")
    assert (done.returncode, done.stdout) == (0, "hi\n")
    assert extract_result(done.stdout.splitlines()) is None


def test_an_oversize_result_is_cut_by_the_wrapper_and_refused(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text('"' + "a" * (2**20 + 10) + '"\n')
    done = run_wrapped(["true"], result)
    assert done.returncode == 0 and f"{RESULT_MARK} too-large" in done.stdout
    with pytest.raises(ResultError, match=r"holds more than 1048576 bytes"):
        extract_result(done.stdout.splitlines())


def test_the_wrapper_forwards_sigterm_to_the_job_and_still_hands_back_its_result(tmp_path: Path) -> None:
    """Kubernetes stops a pod with SIGTERM to its first process: the job must get it, to save its work."""
    ready = tmp_path / "ready"
    script = (
        'trap \'echo "{\\"stopped\\": true}" > "$IRIS_RESULT"; exit 143\' TERM; '
        f"touch {ready}; while :; do sleep 0.05; done"
    )
    process = subprocess.Popen(
        wrapped_command(["sh", "-c", script]),
        env={"PATH": os.environ["PATH"], "IRIS_RESULT": str(tmp_path / "result.json")},
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)  # to the wrapper only, as a container runtime does
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    assert json.loads(extract_result(out.splitlines()) or "") == {"stopped": True}


def test_the_last_frame_counts_and_a_cut_frame_is_an_error() -> None:
    frame = [f"{RESULT_MARK} begin", f"{RESULT_MARK}|[2]", f"{RESULT_MARK} end"]
    earlier = [f"{RESULT_MARK} begin", f"{RESULT_MARK}|[1]", f"{RESULT_MARK} end"]
    assert extract_result(["x", *earlier, "y", *frame]) == "[2]"
    with pytest.raises(ResultError, match="could not be read whole from replica 0's log"):
        extract_result(frame[:2])


class Pod:
    def __init__(self) -> None:
        from types import SimpleNamespace

        self.metadata = SimpleNamespace(name="p0", annotations={}, labels={}, creation_timestamp=None)
        self.status = SimpleNamespace(phase="Succeeded")


def test_the_relayed_output_leaves_the_frame_out_and_its_cursor_moves_past_it() -> None:
    log = "".join(
        f"2026-01-01T00:00:0{i}.000000000Z {line}\n"
        for i, line in enumerate(["trained", f"{RESULT_MARK} begin", f"{RESULT_MARK}|[1]", f"{RESULT_MARK} end"])
    )
    reader = LogReader("", 100, 0)
    reader.take(Pod(), log)
    chunk = reader.chunk()
    assert chunk.lines == ("[replica 0] trained",)
    again = LogReader(chunk.next_cursor, 100, 0)
    again.take(Pod(), log)
    assert again.chunk().lines == ()

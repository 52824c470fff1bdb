"""The process backend for real: detached supervisors, device slots, queueing, eviction, cancel, logs.

Every job here is a short shell command; a job that must stay up waits for a release file the test
creates, so nothing depends on how fast the machine is, only on polling with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TypeVar

import pytest

from iris_airflow_provider.backends.base import (
    AlreadyExistsError,
    InsufficientCapacityError,
    Submission,
    SubmissionRefusedError,
)
from iris_airflow_provider.backends.process.backend import ProcessBackend
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from tests.backends.process_helpers import (
    Gates,
    gpu_backend,
    job_spec,
    log_lines,
    process_gone,
    status_file,
    submit,
)
from tests.waiting import wait_for, wait_state

T = TypeVar("T")


# Capacity ---------------------------------------------------------------------------------------


def test_an_idle_backend_reports_everything_free_in_the_seeds_shape(state_dir: Path) -> None:
    backend = ProcessBackend(
        "gpu",
        state_dir,
        devices={"H100": 8, "a100": 2},
        attributes={"region": ["us-east"]},
        clock=lambda: 1_234_567,
    )
    described = backend.describe()
    assert described.backend_id == "gpu" and described.kind == "process"
    assert dict(described.advertised) == {
        "device-type": ("gpu",),
        "device-variant": ("a100", "h100"),
        "region": ("us-east",),
    }
    assert described.availability is not None
    assert described.availability.to_wire() == {
        "version": 2,
        "observation_epoch_ms": 1_234_567,
        "amounts": {"h100": 8, "a100": 2},
        "total_amounts": {"h100": 8, "a100": 2},
        "held_by_band": [],
    }
    assert described.tracked


def test_capacity_counts_what_running_jobs_hold_per_band_and_ignores_queued_work(state_dir: Path, gates: Gates) -> None:
    times = iter(range(10_000, 10_000_000, 1_000))
    backend = gpu_backend(state_dir, 4, clock=lambda: next(times))
    submit(backend, job_spec("/a/batch", gates.held("batch"), gpus=1, replicas=2, band="batch"), at=1)
    submit(backend, job_spec("/a/prod", gates.held("prod"), gpus=1, band="production"), at=2)
    # Needs 4 at interactive: it may only reclaim the batch job's 2, which is not enough: it waits.
    submit(backend, job_spec("/a/waits", "true", gpus=4, band="interactive"), at=3)
    wait_state(backend, "/a/batch", JobState.RUNNING)
    wait_state(backend, "/a/prod", JobState.RUNNING)
    assert backend.status("/a/waits").state is JobState.PENDING  # type: ignore[union-attr]

    first = backend.describe().availability
    second = backend.describe().availability
    assert first is not None and second is not None
    assert first.amounts == {"h100": 1}  # the queued job holds nothing
    assert first.total_amounts == {"h100": 4}
    assert first.held_by_band == {Band.BATCH: {"h100": 2}, Band.PRODUCTION: {"h100": 1}}
    # The same numbers are the same observation, in any process reading this state directory.
    assert second.observation_epoch_ms == first.observation_epoch_ms
    other = ProcessBackend.from_state_dir(state_dir).describe().availability
    assert other is not None and other.observation_epoch_ms == first.observation_epoch_ms
    assert first.to_wire()["held_by_band"] == [
        {"band": "PRIORITY_BAND_PRODUCTION", "amounts": {"h100": 1}},
        {"band": "PRIORITY_BAND_BATCH", "amounts": {"h100": 2}},
    ]
    for name in ("batch", "prod"):
        gates.release(name)
    wait_state(backend, "/a/batch", JobState.SUCCEEDED)
    wait_state(backend, "/a/prod", JobState.SUCCEEDED)
    wait_state(backend, "/a/waits", JobState.SUCCEEDED)
    final = backend.describe().availability
    assert final is not None and final.amounts == {"h100": 4} and final.held_by_band == {}
    assert final.observation_epoch_ms > first.observation_epoch_ms  # new numbers, new observation


def test_a_cpu_backend_advertises_cpu_and_no_device_variant(state_dir: Path) -> None:
    backend = ProcessBackend("cpu", state_dir, max_running_jobs=2)
    described = backend.describe()
    assert dict(described.advertised) == {"device-type": ("cpu",)}
    assert described.availability is not None and described.availability.total_amounts == {}


# Replicas, slots, output ------------------------------------------------------------------------


def test_each_replica_gets_its_own_device_slots_and_its_output_is_logged(state_dir: Path) -> None:
    backend = gpu_backend(state_dir, 8)
    command = (
        'echo "replica=$IRIS_REPLICA_INDEX of $IRIS_NUM_REPLICAS cuda=$CUDA_VISIBLE_DEVICES '
        "slots=$IRIS_DEVICE_SLOTS variant=$IRIS_DEVICE_VARIANT job=$IRIS_JOB_ID backend=$IRIS_BACKEND_ID "
        "rank=$RANK node_rank=$NODE_RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT "
        'coordinator=$IRIS_COORDINATOR_ADDRESS"'
    )
    outcome = submit(backend, job_spec("/alice/multi", command, gpus=2, replicas=3))
    assert not outcome.replay
    assert outcome.report.state in (JobState.ACCEPTED, JobState.RUNNING)
    report = wait_state(backend, "/alice/multi", JobState.SUCCEEDED)
    assert report.exit_code == 0 and report.error == ""
    assert [(r.index, r.state, r.exit_code) for r in report.replicas] == [(i, JobState.SUCCEEDED, 0) for i in range(3)]
    lines = sorted(log_lines(backend, "/alice/multi"))
    assert len(lines) == 3
    slots = []
    coordinators = set()
    for index, line in enumerate(lines):
        assert line.startswith(f"[replica {index}] replica={index} of 3 cuda=")
        assert "variant=h100 job=/alice/multi backend=gpu" in line
        fields = dict(part.split("=", 1) for part in line.split("] ", 1)[1].split() if "=" in part)
        assert fields["cuda"] == fields["slots"]
        slots.append([int(s) for s in fields["slots"].split(",")])
        # The rendezvous: each replica's rank under every launcher's name, replica 0 on loopback.
        assert (fields["rank"], fields["node_rank"], fields["world"]) == (str(index), str(index), "3")
        assert fields["master"] == fields["coordinator"] and fields["master"].startswith("127.0.0.1:")
        coordinators.add(fields["coordinator"])
    assert len(coordinators) == 1 and int(coordinators.pop().split(":")[1]) > 0
    assert all(len(s) == 2 for s in slots)
    assert len({s for replica in slots for s in replica}) == 6  # no slot handed out twice
    assert all(0 <= s < 8 for replica in slots for s in replica)


def test_logs_return_only_new_lines_bounded_by_max_lines(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir)
    command = gates.held("more", before="for i in 1 2 3 4 5; do echo line $i; done") + "; echo line 6"
    submit(backend, job_spec("/alice/logs", command))
    wait_for(lambda: len(log_lines(backend, "/alice/logs")) == 5, "five lines")

    first = backend.logs("/alice/logs", max_lines=2)
    assert first.lines == ("[replica 0] line 1", "[replica 0] line 2") and first.truncated
    second = backend.logs("/alice/logs", first.next_cursor, max_lines=2)
    assert second.lines == ("[replica 0] line 3", "[replica 0] line 4") and second.truncated
    third = backend.logs("/alice/logs", second.next_cursor, max_lines=2)
    assert third.lines == ("[replica 0] line 5",) and not third.truncated
    nothing = backend.logs("/alice/logs", third.next_cursor)
    assert nothing.lines == () and nothing.next_cursor == third.next_cursor

    gates.release("more")
    wait_state(backend, "/alice/logs", JobState.SUCCEEDED)
    assert backend.logs("/alice/logs", third.next_cursor).lines == ("[replica 0] line 6",)
    assert backend.logs("/nobody/here", "").lines == ()


def test_a_last_line_without_a_newline_is_returned_once_the_job_has_ended(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir)
    submit(backend, job_spec("/alice/partial", gates.held("go", before="printf 'whole\\nhalf'")))
    wait_for(lambda: log_lines(backend, "/alice/partial"), "the first line")
    running = backend.logs("/alice/partial")
    assert running.lines == ("[replica 0] whole",)  # the partial line waits while the job may still write
    gates.release("go")
    wait_state(backend, "/alice/partial", JobState.SUCCEEDED)
    ended = backend.logs("/alice/partial", running.next_cursor)
    assert ended.lines == ("[replica 0] half",)
    assert backend.logs("/alice/partial", ended.next_cursor).lines == ()


# Exit codes -------------------------------------------------------------------------------------


def test_a_failing_replica_fails_the_job_with_its_code_and_stops_the_others(state_dir: Path, tmp_path: Path) -> None:
    backend = gpu_backend(state_dir)
    pids = tmp_path / "pids"
    pids.mkdir()
    # Replica 1 fails at once; replica 0 would run for a minute.
    command = (
        f'if [ "$IRIS_REPLICA_INDEX" = 1 ]; then while [ ! -e {pids}/survivor ]; do sleep 0.02; done; exit 3; fi; '
        f"echo $$ > {pids}/survivor.tmp; mv {pids}/survivor.tmp {pids}/survivor; exec sleep 60"
    )
    started = time.monotonic()
    submit(backend, job_spec("/alice/fails", command, gpus=1, replicas=2))
    report = wait_state(backend, "/alice/fails", JobState.FAILED)
    assert time.monotonic() - started < 8  # the sleeping replica was stopped, not waited for
    assert report.exit_code == 3
    assert report.error == "Replica 1 exited with code 3"
    by_index = {r.index: r for r in report.replicas}
    assert by_index[1].exit_code == 3 and by_index[1].state is JobState.FAILED
    assert by_index[0].exit_code not in (0, None)  # terminated
    assert process_gone(int((pids / "survivor").read_text()))
    free = backend.describe().availability
    assert free is not None and free.amounts == {"h100": 4}


def test_a_command_that_does_not_exist_fails_the_job(state_dir: Path) -> None:
    backend = gpu_backend(state_dir)
    submit(backend, job_spec("/alice/typo", ["/no/such/program"]))
    report = wait_state(backend, "/alice/typo", JobState.FAILED)
    assert report.exit_code == 127
    assert "could not start '/no/such/program'" in report.error


# Idempotency ------------------------------------------------------------------------------------


def test_submit_is_idempotent_by_nonce(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir)
    spec = job_spec("/alice/once", gates.held("once", before="echo ran"), gpus=1)
    first = submit(backend, spec, "n1")
    assert not first.replay
    replay = submit(backend, spec, "n1")
    assert replay.replay and replay.report.nonce == "n1"
    with pytest.raises(AlreadyExistsError, match="still running here as another incarnation"):
        submit(backend, spec, "n2")
    wait_for(lambda: log_lines(backend, "/alice/once"), "output")
    gates.release("once")
    done = wait_state(backend, "/alice/once", JobState.SUCCEEDED)
    assert done.nonce == "n1"
    assert log_lines(backend, "/alice/once") == ["[replica 0] ran"]  # started once, not per submit
    assert submit(backend, spec, "n1").replay  # a replay of a finished incarnation changes nothing
    assert backend.status("/alice/once").state is JobState.SUCCEEDED  # type: ignore[union-attr]

    again = submit(backend, spec, "n2")  # it finished: a new incarnation runs
    assert not again.replay and again.report.nonce == "n2"
    report = wait_state(backend, "/alice/once", JobState.SUCCEEDED)
    assert report.nonce == "n2"
    assert log_lines(backend, "/alice/once") == ["[replica 0] ran"]  # the new incarnation's own log


def test_a_job_the_backend_can_never_host_is_refused_with_the_reason(state_dir: Path, tmp_path: Path) -> None:
    backend = gpu_backend(state_dir, 8)
    with pytest.raises(InsufficientCapacityError, match=r"cannot ever host 2 x 8 h100: it has \{'h100': 8\}"):
        submit(backend, job_spec("/alice/big", gpus=8, replicas=2))  # too small: a larger cluster may take it
    with pytest.raises(SubmissionRefusedError, match="cannot ever host 1 x 1 a100") as wrong_variant:
        submit(backend, job_spec("/alice/a100", gpus=1, variant="a100"))
    assert not isinstance(wrong_variant.value, InsufficientCapacityError)
    with pytest.raises(SubmissionRefusedError, match="has gpu devices, not tpu"):
        submit(backend, job_spec("/alice/tpu", gpus=4, device="tpu", variant="v5p-8"))
    cpu = ProcessBackend("cpu", tmp_path / "cpu")
    with pytest.raises(SubmissionRefusedError, match="has cpu devices, not gpu"):
        submit(cpu, job_spec("/alice/gpu", gpus=1))
    for job_id in ("/alice/big", "/alice/a100", "/alice/tpu"):
        assert backend.status(job_id) is None  # nothing was recorded
    assert backend.live_job_ids() == []


def test_an_auto_variant_takes_the_first_variant_with_room(state_dir: Path) -> None:
    backend = ProcessBackend("gpu", state_dir, devices={"a100": 1, "h100": 4})
    submit(backend, job_spec("/alice/auto", 'echo "$IRIS_DEVICE_VARIANT $IRIS_DEVICE_SLOTS"', gpus=2, variant="auto"))
    wait_state(backend, "/alice/auto", JobState.SUCCEEDED)
    assert log_lines(backend, "/alice/auto") == ["[replica 0] h100 0,1"]


# Queueing and eviction --------------------------------------------------------------------------


def test_work_waits_for_busy_slots_and_starts_in_band_order_when_they_free(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 2)
    submit(backend, job_spec("/a/first", gates.held("first"), gpus=2, band="production"), at=1)
    wait_state(backend, "/a/first", JobState.RUNNING)
    # Submitted earlier but a lower band: it must start after the priority job.
    submit(backend, job_spec("/a/batch", gates.held("batch"), gpus=2, band="batch"), at=2)
    submit(backend, job_spec("/a/priority", gates.held("priority"), gpus=2, band="priority"), at=3)
    assert backend.status("/a/batch").state is JobState.PENDING  # type: ignore[union-attr]
    assert backend.status("/a/priority").state is JobState.PENDING  # type: ignore[union-attr]
    assert backend.live_job_ids() == ["/a/batch", "/a/first", "/a/priority"]

    gates.release("first")  # the supervisor starts queued work as it exits; nobody needs to poll
    wait_for(
        lambda: json.loads(status_file(state_dir, "/a/priority").read_text())["state"] == "running",
        "/a/priority to start",
    )
    assert backend.status("/a/batch").state is JobState.PENDING  # type: ignore[union-attr]
    gates.release("priority")
    wait_state(backend, "/a/batch", JobState.RUNNING)
    gates.release("batch")
    wait_state(backend, "/a/batch", JobState.SUCCEEDED)
    assert backend.live_job_ids() == []


def test_max_running_jobs_queues_the_rest(tmp_path: Path, gates: Gates) -> None:
    backend = ProcessBackend("cpu", tmp_path / "cpu", max_running_jobs=1)
    submit(backend, job_spec("/a/one", gates.held("one")), at=1)
    submit(backend, job_spec("/a/two", "echo two"), at=2)
    wait_state(backend, "/a/one", JobState.RUNNING)
    assert backend.status("/a/two").state is JobState.PENDING  # type: ignore[union-attr]
    gates.release("one")
    wait_state(backend, "/a/two", JobState.SUCCEEDED)


def test_a_higher_band_takes_a_run_slot_from_lower_band_work_when_max_running_jobs_is_reached(
    tmp_path: Path, gates: Gates
) -> None:
    backend = ProcessBackend("cpu", tmp_path / "cpu", max_running_jobs=2)
    submit(backend, job_spec("/a/old", gates.held("old", before="echo attempt"), band="batch"), at=1)
    wait_for(lambda: log_lines(backend, "/a/old"), "the first batch job to start")
    submit(backend, job_spec("/a/new", gates.held("new", before="echo attempt"), band="batch"), at=2)
    wait_for(lambda: log_lines(backend, "/a/new"), "the second batch job to start")
    submit(backend, job_spec("/a/same", "echo same band", band="batch"), at=3)
    assert backend.status("/a/same").state is JobState.PENDING  # type: ignore[union-attr]  # equal bands wait

    submit(backend, job_spec("/a/urgent", gates.held("urgent"), band="production"), at=4)
    wait_state(backend, "/a/urgent", JobState.RUNNING)
    evicted = backend.status("/a/new")
    assert evicted is not None and evicted.state is JobState.PENDING  # the newest batch job, back in the queue
    assert backend.status("/a/old").state is JobState.RUNNING  # type: ignore[union-attr]

    gates.release("urgent")
    gates.release("old")
    wait_state(backend, "/a/same", JobState.SUCCEEDED)
    wait_for(lambda: len(log_lines(backend, "/a/new")) == 2, "the evicted job to run again")
    gates.release("new")
    assert wait_state(backend, "/a/new", JobState.SUCCEEDED).exit_code == 0


def test_a_higher_band_evicts_lower_band_work_which_requeues_and_runs_again(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 2)
    submit(backend, job_spec("/a/batch", gates.held("batch", before="echo attempt"), gpus=2, band="batch"), at=1)
    wait_for(lambda: log_lines(backend, "/a/batch"), "the batch job to start")

    submit(backend, job_spec("/a/urgent", gates.held("urgent"), gpus=2, band="production"), at=2)
    wait_state(backend, "/a/urgent", JobState.RUNNING)
    batch = backend.status("/a/batch")
    assert batch is not None and batch.state is JobState.PENDING  # back in the queue, not failed
    status = json.loads(status_file(state_dir, "/a/batch").read_text())
    assert status["preemptions"] == 1
    capacity = backend.describe().availability
    assert capacity is not None and capacity.held_by_band == {Band.PRODUCTION: {"h100": 2}}

    gates.release("urgent")
    wait_state(backend, "/a/urgent", JobState.SUCCEEDED)
    wait_for(lambda: len(log_lines(backend, "/a/batch")) == 2, "the batch job to run again")
    gates.release("batch")
    report = wait_state(backend, "/a/batch", JobState.SUCCEEDED)
    assert report.exit_code == 0
    assert log_lines(backend, "/a/batch") == ["[replica 0] attempt", "[replica 0] attempt"]
    assert json.loads(status_file(state_dir, "/a/batch").read_text())["attempts"] == 2


def test_eviction_takes_the_lowest_band_first_then_the_newest_job(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 3)
    submit(backend, job_spec("/a/old-batch", gates.held("old-batch"), gpus=1, band="batch"), at=1)
    wait_state(backend, "/a/old-batch", JobState.RUNNING)
    # Takes half a second to stop once told, as real work that checkpoints would.
    slow_to_stop = gates.held("new-batch", before="trap 'sleep 0.5; exit 143' TERM; echo ready")
    submit(backend, job_spec("/a/new-batch", slow_to_stop, gpus=1, band="batch"), at=2)
    wait_for(lambda: log_lines(backend, "/a/new-batch") == ["[replica 0] ready"], "the trap")
    submit(backend, job_spec("/a/interactive", gates.held("interactive"), gpus=1), at=3)
    wait_state(backend, "/a/interactive", JobState.RUNNING)

    submit(backend, job_spec("/a/production", gates.held("production"), gpus=1, band="production"), at=4)
    for _ in range(5):  # scheduling passes while the evicted job drains must not evict anyone else
        backend.describe()
        time.sleep(0.05)
    wait_state(backend, "/a/production", JobState.RUNNING)
    assert backend.status("/a/new-batch").state is JobState.PENDING  # type: ignore[union-attr]
    assert backend.status("/a/old-batch").state is JobState.RUNNING  # type: ignore[union-attr]
    assert backend.status("/a/interactive").state is JobState.RUNNING  # type: ignore[union-attr]
    gates.release("production")
    wait_state(backend, "/a/new-batch", JobState.RUNNING)  # the freed slot goes back to it
    for name in ("old-batch", "new-batch", "interactive"):
        gates.release(name)
    for job_id in ("/a/old-batch", "/a/new-batch", "/a/interactive", "/a/production"):
        wait_state(backend, job_id, JobState.SUCCEEDED)
    preemptions = {
        job_id: json.loads(status_file(state_dir, job_id).read_text()).get("preemptions", 0)
        for job_id in ("/a/old-batch", "/a/new-batch", "/a/interactive")
    }
    assert preemptions == {"/a/old-batch": 0, "/a/new-batch": 1, "/a/interactive": 0}


def test_equal_or_higher_bands_are_never_evicted(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 2)
    submit(backend, job_spec("/a/running", gates.held("running"), gpus=2, band="interactive"), at=1)
    wait_state(backend, "/a/running", JobState.RUNNING)
    submit(backend, job_spec("/a/same", "true", gpus=2, band="interactive"), at=2)
    submit(backend, job_spec("/a/lower", "true", gpus=2, band="batch"), at=3)
    time.sleep(0.3)
    assert backend.status("/a/running").state is JobState.RUNNING  # type: ignore[union-attr]
    assert backend.status("/a/same").state is JobState.PENDING  # type: ignore[union-attr]
    assert backend.status("/a/lower").state is JobState.PENDING  # type: ignore[union-attr]
    gates.release("running")
    wait_state(backend, "/a/same", JobState.SUCCEEDED)
    wait_state(backend, "/a/lower", JobState.SUCCEEDED)


# Cancel -----------------------------------------------------------------------------------------


def test_cancelling_a_queued_job_ends_it_without_running_it(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 1)
    submit(backend, job_spec("/a/busy", gates.held("busy"), gpus=1), at=1)
    submit(backend, job_spec("/a/queued", "echo should-not-run", gpus=1), at=2)
    assert backend.cancel("/a/queued")
    report = backend.status("/a/queued")
    assert report is not None and report.state is JobState.KILLED
    assert report.error == "Cancelled while queued"
    gates.release("busy")
    wait_state(backend, "/a/busy", JobState.SUCCEEDED)
    assert backend.status("/a/queued").state is JobState.KILLED  # type: ignore[union-attr]
    assert log_lines(backend, "/a/queued") == []
    assert not backend.cancel("/a/unknown")


def test_cancelling_a_running_job_terminates_its_process_group(state_dir: Path, tmp_path: Path) -> None:
    backend = gpu_backend(state_dir)
    pids = tmp_path / "pids"
    pids.mkdir()
    # The shell's child (sleep) is a grandchild of the supervisor: only a group signal reaches it.
    command = f"sleep 60 & echo $! > {pids}/sleep-$IRIS_REPLICA_INDEX; wait"
    submit(backend, job_spec("/a/cancel", command, gpus=1, replicas=2))
    wait_for(lambda: len(list(pids.iterdir())) == 2, "both replicas to start")
    sleepers = [int(p.read_text()) for p in pids.iterdir()]
    assert not any(process_gone(pid) for pid in sleepers)
    assert backend.cancel("/a/cancel")
    report = wait_state(backend, "/a/cancel", JobState.KILLED)
    assert report.error == "Cancelled"
    wait_for(lambda: all(process_gone(pid) for pid in sleepers), "every replica's processes to end")
    assert backend.cancel("/a/cancel")  # already finished: a no-op, still known
    assert backend.status("/a/cancel").state is JobState.KILLED  # type: ignore[union-attr]


def test_a_replica_shutting_down_gracefully_is_told_to_stop_only_once(state_dir: Path) -> None:
    backend = gpu_backend(state_dir)
    graceful = "trap 'echo stopping; sleep 0.4; echo stopped; exit 0' TERM; echo ready; while true; do sleep 0.02; done"
    submit(backend, job_spec("/a/graceful", graceful, gpus=1))
    wait_for(lambda: log_lines(backend, "/a/graceful") == ["[replica 0] ready"], "the trap")
    started = time.monotonic()
    assert backend.cancel("/a/graceful")
    wait_state(backend, "/a/graceful", JobState.KILLED)
    assert time.monotonic() - started < 5  # it finished its shutdown; it was not killed after the grace period
    lines = log_lines(backend, "/a/graceful")
    assert lines[-1] == "[replica 0] stopped"
    # The group signal and the supervisor's own: at most two, not one every tenth of a second.
    assert 1 <= lines.count("[replica 0] stopping") <= 2


# Surviving the process that started the job ----------------------------------------------------


def test_jobs_outlive_the_backend_object_and_another_one_sees_them(state_dir: Path, gates: Gates) -> None:
    first = gpu_backend(state_dir, 1)
    submit(first, job_spec("/a/long", gates.held("long", before="echo hi"), gpus=1), at=1)
    submit(first, job_spec("/a/next", "echo next", gpus=1), at=2)
    wait_state(first, "/a/long", JobState.RUNNING)
    del first  # as when the Airflow process that submitted it exits

    second = ProcessBackend.from_state_dir(state_dir)
    assert second.devices == {"h100": 1}
    report = second.status("/a/long")
    assert report is not None and report.state is JobState.RUNNING and report.nonce == "n1"
    assert second.live_job_ids() == ["/a/long", "/a/next"]
    with pytest.raises(AlreadyExistsError):
        submit(second, job_spec("/a/long", "true", gpus=1), "other-nonce")
    gates.release("long")
    wait_state(second, "/a/next", JobState.SUCCEEDED)
    third = gpu_backend(state_dir, 1)
    assert third.status("/a/long").state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert log_lines(third, "/a/next") == ["[replica 0] next"]


def test_the_reaper_settles_a_job_whose_supervisor_was_killed(state_dir: Path, tmp_path: Path) -> None:
    backend = gpu_backend(state_dir, 1)
    pids = tmp_path / "pids"
    pids.mkdir()
    submit(backend, job_spec("/a/orphan", f"echo $$ > {pids}/replica; exec sleep 60", gpus=1), at=1)
    submit(backend, job_spec("/a/waiting", "echo ran", gpus=1), at=2)
    wait_for(lambda: (pids / "replica").exists() and (pids / "replica").read_text().strip(), "the replica")
    replica = int((pids / "replica").read_text())
    supervisor = json.loads(status_file(state_dir, "/a/orphan").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: process_gone(supervisor), "the supervisor to die")

    report = backend.status("/a/orphan")
    assert report is not None and report.state is JobState.FAILED
    assert report.error == "The job's supervisor process died"
    # Its replica no longer holds the slot it was given, and the queued job got it.
    wait_for(lambda: process_gone(replica), "the orphaned replica to be stopped")
    wait_state(backend, "/a/waiting", JobState.SUCCEEDED)


# Environment ------------------------------------------------------------------------------------


def test_the_environment_is_clean_then_backend_defaults_then_the_job_env(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    backend = gpu_backend(state_dir, env={"TEAM": "backend-team", "SHARED": "backend"})
    command = 'echo "secret=${SECRET_TOKEN:-unset} team=$TEAM shared=$SHARED own=$OWN path=${PATH:+set}"'
    submit(backend, job_spec("/a/env", command, gpus=1, env={"SHARED": "job", "OWN": "mine"}))
    wait_state(backend, "/a/env", JobState.SUCCEEDED)
    assert log_lines(backend, "/a/env") == ["[replica 0] secret=unset team=backend-team shared=job own=mine path=set"]


def test_the_parent_environment_cannot_be_read_through_the_supervisor(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    backend = gpu_backend(state_dir)
    command = 'if tr "\\0" "\\n" < /proc/$PPID/environ | grep -q SECRET_TOKEN; then echo leaked; else echo clean; fi'
    submit(backend, job_spec("/a/peek", command, gpus=1))
    wait_state(backend, "/a/peek", JobState.SUCCEEDED)
    assert log_lines(backend, "/a/peek") == ["[replica 0] clean"]


def test_a_job_without_devices_on_a_gpu_backend_sees_no_gpu(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    backend = gpu_backend(state_dir)
    submit(backend, job_spec("/a/cpu-only", 'echo "cuda=${CUDA_VISIBLE_DEVICES-unset}"'))
    wait_state(backend, "/a/cpu-only", JobState.SUCCEEDED)
    assert log_lines(backend, "/a/cpu-only") == ["[replica 0] cuda="]


def test_files_that_travel_with_the_job_are_in_its_workdir(tmp_path):
    from iris_airflow_provider.backends.process.backend import ProcessBackend

    backend = ProcessBackend("cpu", tmp_path / "state")
    spec = parse_job(
        {
            "job_id": "/u/files",
            "command": "cat run/config.txt; wc -c < blob.bin",
            "files": {"run/config.txt": "lr=0.1\n", "blob.bin": "base64:AAECAw=="},
        }
    )
    backend.submit(Submission("/u/files", "n1", spec, "", 0))
    deadline = time.monotonic() + 20
    while (report := backend.status("/u/files")).state.value not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert report.state.value == "succeeded"
    assert [line.split("] ", 1)[1] for line in backend.logs("/u/files").lines] == ["lr=0.1", "4"]


def test_a_late_end_report_of_another_incarnation_or_attempt_is_ignored(state_dir: Path, gates: Gates) -> None:
    backend = gpu_backend(state_dir, 1)
    submit(backend, job_spec("/a/live", gates.held("live"), gpus=1), nonce="n2")
    wait_state(backend, "/a/live", JobState.RUNNING)
    backend.supervisor_finished("/a/live", [0], "", nonce="n1", attempt=1)  # the previous incarnation's
    backend.supervisor_finished("/a/live", [1], "Replica 0 exited with code 1", nonce="n2", attempt=0)
    assert backend.status("/a/live").state is JobState.RUNNING  # type: ignore[union-attr]
    gates.release("live")
    assert wait_state(backend, "/a/live", JobState.SUCCEEDED).exit_code == 0


def test_a_run_evicted_back_to_the_queue_leaves_no_result_for_the_next_run(state_dir: Path, gates: Gates) -> None:
    """The first run writes a result and is evicted; the second writes none: the job hands back none."""
    ran = gates.directory / "ran"
    first_run = f'[ -e {ran} ] || {{ touch {ran}; echo "[1]" > "$IRIS_RESULT"; }}'
    backend = gpu_backend(state_dir, 2)
    submit(backend, job_spec("/a/batch", gates.held("batch", before=first_run), gpus=2, band="batch"), at=1)
    wait_for(ran.exists, "the batch job's first run")
    submit(backend, job_spec("/a/urgent", "true", gpus=2, band="production"), at=2)
    wait_state(backend, "/a/urgent", JobState.SUCCEEDED)
    gates.release("batch")
    report = wait_state(backend, "/a/batch", JobState.SUCCEEDED)
    assert json.loads(status_file(state_dir, "/a/batch").read_text())["attempts"] == 2
    assert report.result is None


def test_each_named_port_gets_a_free_loopback_port_per_replica_and_replica_0s_is_served(state_dir: Path) -> None:
    backend = gpu_backend(state_dir, 2)
    spec = parse_job(
        {
            "job_id": "/alice/serve",
            "command": 'echo "http=$IRIS_PORT_HTTP metrics=$IRIS_PORT_METRICS"; sleep 30',
            "resources": {"replicas": 2},
            "ports": [{"name": "http"}, {"name": "metrics"}],
        }
    )
    submit(backend, spec, nonce="n7")
    lines = wait_for(
        lambda: sorted(log_lines(backend, "/alice/serve")) if len(log_lines(backend, "/alice/serve")) == 2 else None,
        "both replicas' ports",
    )
    ports = [dict(part.split("=") for part in line.split("] ", 1)[1].split()) for line in lines]
    numbers = [int(p[name]) for p in ports for name in ("http", "metrics")]
    assert len(set(numbers)) == 4 and all(n > 0 for n in numbers)
    served = backend.served_port("/alice/serve", "http")
    assert served is not None and (served.host, served.port, served.nonce) == ("127.0.0.1", int(ports[0]["http"]), "n7")
    assert backend.served_port("/alice/serve", "admin") is None
    assert backend.cancel("/alice/serve")
    wait_state(backend, "/alice/serve", JobState.KILLED)
    assert backend.served_port("/alice/serve", "http") is None

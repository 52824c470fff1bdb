"""Issue 11, at the job model: every number within its range, files valid as a set, no control
characters where they do harm, the backends' environment names reserved, every input bounded.
Each refusal names the field and what it accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.limits import (
    LATEST_DEADLINE_MS,
    MAX_ARGUMENT_BYTES,
    MAX_COMMAND_ARGUMENTS,
    MAX_CONSTRAINTS,
    MAX_ENV_VARIABLES,
    MAX_FILE_PATH_BYTES,
    MAX_FILES_BYTES,
    MAX_MEMORY_PER_REPLICA,
)
from iris_airflow_provider.core.model import parse_job


def problems(**fields: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as error:
        parse_job({"job_id": "/alice/train", **fields})
    return {p.path: p.message for p in error.value.problems}


def gpu(count: Any = 8, **resources: Any) -> dict[str, Any]:
    return {"device": {"type": "gpu", "variant": "h100", "count": count}, **resources}


class TestNumbers:
    @pytest.mark.parametrize(
        ("resources", "path", "message"),
        [
            # The attacks of issue 11: each was accepted, or crashed, before.
            (
                {"memory": json.loads("1e400")},
                "memory",
                "between 0 and 35184372088832 bytes per replica (32Ti), got inf",
            ),
            ({"cpu": "inf"}, "cpu", "between 0 and 1024 cores per replica, got inf"),
            ({"replicas": 1e6}, "replicas", "between 1 and 4096 replicas per job, got 1000000.0"),
            ({"replicas": 10**9}, "replicas", "between 1 and 4096 replicas per job, got 1000000000"),
            # And their kin.
            ({"replicas": 4097}, "replicas", "between 1 and 4096 replicas per job, got 4097"),
            ({"replicas": "5000"}, "replicas", "between 1 and 4096 replicas per job, got 5000.0"),
            ({"replicas": True}, "replicas", "between 1 and 4096 replicas per job, got true"),
            (
                {"replicas": 10**400},
                "replicas",
                "between 1 and 4096 replicas per job, got a number of about 401 digits",
            ),
            ({"cpu": float("nan")}, "cpu", "between 0 and 1024 cores per replica, got nan"),
            ({"cpu": 1025}, "cpu", "between 0 and 1024 cores per replica, got 1025"),
            ({"cpu": False}, "cpu", "between 0 and 1024 cores per replica, got false"),
            ({"memory": "1e400"}, "memory", "must be bytes or a quantity"),
            ({"memory": "9" * 400 + "Gi"}, "memory", "bytes per replica (32Ti), got inf"),
            ({"memory": "33Ti"}, "memory", "bytes per replica (32Ti), got 36283883716608.0"),
            ({"memory": MAX_MEMORY_PER_REPLICA + 1}, "memory", "bytes per replica (32Ti)"),
            (gpu(257), "device.count", "between 0 and 256 devices per replica, got 257"),
            (gpu(float("inf")), "device.count", "between 0 and 256 devices per replica, got inf"),
        ],
    )
    def test_a_number_out_of_range_is_refused_naming_the_field_and_the_range(self, resources, path, message):
        found = problems(resources=resources)
        assert list(found) == [f"resources.{path}"]
        assert message in found[f"resources.{path}"]

    @pytest.mark.parametrize("deadline", [1e30, 10**30, LATEST_DEADLINE_MS + 1, float("inf"), "1e30", True])
    def test_a_scheduling_deadline_must_be_an_epoch_time_before_2100(self, deadline):
        found = problems(scheduling_deadline_ms=deadline)
        assert "between 0 and 4102444800000 epoch milliseconds (before 2100-01-01)" in found["scheduling_deadline_ms"]

    def test_the_largest_accepted_values_are_accepted(self):
        job = parse_job(
            {
                "job_id": "/alice/train",
                "resources": gpu(256, replicas=4096, cpu=1024, memory="32Ti"),
                "scheduling_deadline_ms": LATEST_DEADLINE_MS,
            }
        )
        assert (job.resources.replicas, job.resources.device.count, job.resources.cpu) == (4096, 256, 1024)
        assert job.resources.memory == MAX_MEMORY_PER_REPLICA
        assert job.gate == {"h100": 4096 * 256}

    def test_lower_bounds_keep_their_messages(self):
        assert problems(resources={"replicas": 0}) == {"resources.replicas": "must be >= 1"}
        assert problems(scheduling_deadline_ms=-1) == {"scheduling_deadline_ms": "must be >= 0"}

    @pytest.mark.parametrize("value", [float("inf"), float("nan"), 2**53 + 1, "9" * 20])
    def test_constraint_numbers_are_finite_and_exact_in_json(self, value):
        found = problems(constraints=[{"key": "gpu-count", "op": "GE", "value": value}])
        assert list(found) == ["constraints[0].values"]


class TestFiles:
    def test_a_file_that_is_a_directory_of_another_is_refused(self):
        # Issue 11: a 500, and the job id wedged on the peer's process backend for good.
        assert problems(files={"a": "x", "a/b": "y"}) == {"files": "'a' is a file and a directory of 'a/b'"}
        assert "'a/b' is a file and a directory of 'a/b/c/d'" in problems(files={"a/b": "x", "a/b/c/d": "y"})["files"]

    @pytest.mark.parametrize(
        ("path", "problem"),
        [
            (".", "must not have empty, '.' or '..' segments"),
            ("a/./b", "must not have empty, '.' or '..' segments"),
            ("../etc/passwd", "must not have empty, '.' or '..' segments"),
            ("a//b", "must not have empty, '.' or '..' segments"),
            ("a/", "must not have empty, '.' or '..' segments"),
            ("", "must be a relative path inside the job's workdir"),
            ("/etc/passwd", "must be a relative path inside the job's workdir"),
            ("a\\b", "must use / between directories, not \\"),
            ("notes\x00.txt", "holds U+0000 (NUL)"),
            ("notes\n.txt", "holds U+000A"),
            ("x" * 256, "has a segment longer than 255 bytes"),
            ("é" * 128, "has a segment longer than 255 bytes"),  # bytes, not characters
            ("/".join(["x" * 200] * 6), f"is longer than {MAX_FILE_PATH_BYTES} bytes"),
        ],
    )
    def test_a_bad_name_is_refused_naming_it(self, path, problem):
        assert problem in problems(files={path: "x"})["files"]

    def test_every_bad_name_is_named_in_one_error(self):
        message = problems(files={".": "x", "a\x00": "y", "ok.txt": "z"})["files"]
        assert message == "'.': must not have empty, '.' or '..' segments; 'a\\x00': holds U+0000 (NUL)"

    def test_contents_are_valid_and_bounded(self):
        assert "lone surrogate" in problems(files={"a": "\ud800"})["files"]
        assert "not valid base64" in problems(files={"a": "base64:%%%"})["files"]
        assert "at most 256 files" in problems(files={"a": "x" * (MAX_FILES_BYTES + 1)})["files"]

    def test_deep_and_unicode_names_that_fit_are_fine(self):
        files = {"src/pkg/módulo.py": "print(1)\n", "data/a-b_c.d/e": "base64:AAE="}
        assert parse_job({"job_id": "/a/b", "files": files}).files == files


class TestControlCharacters:
    @pytest.mark.parametrize(
        ("fields", "path"),
        [
            ({"job_id": "/alice/tr\x00ain"}, "job_id"),
            ({"env": {"A": "x\x00y"}}, "env"),
            ({"env": {"A": "\x1b]0;pwned\x07"}}, "env"),
            ({"command": ["echo", "a\x00b"]}, "command"),
            ({"command": "echo \x1b[2J"}, "command"),
            ({"image": "ubuntu\x00:latest"}, "image"),
            ({"image": "ubuntu latest"}, "image"),
            ({"constraints": [{"key": "zone", "op": "EQ", "value": "us\x00"}]}, "constraints[0].values"),
            ({"constraints": [{"key": "zo\x00ne", "op": "EQ", "value": "us"}]}, "constraints[0].key"),
            ({"regions": ["us-east\x00"]}, "regions"),
            ({"target_cluster": "cw\x1b"}, "target_cluster"),
            ({"resources": {"device": {"type": "gpu", "variant": "h\x00", "count": 1}}}, "resources.device.variant"),
        ],
    )
    def test_refused_naming_the_field(self, fields, path):
        found = problems(**fields)
        assert path in found
        assert "U+00" in found[path]  # the character named, never echoed raw

    def test_tabs_and_newlines_are_fine_in_commands_and_env_values(self):
        job = parse_job({"job_id": "/a/b", "command": "set -e\n\tpython train.py", "env": {"CONFIG": "a: 1\nb: 2"}})
        assert job.command == ("/bin/sh", "-c", "set -e\n\tpython train.py")
        assert job.env == {"CONFIG": "a: 1\nb: 2"}


class TestEnvironment:
    @pytest.mark.parametrize("name", ["IRIS_JOB_NONCE", "IRIS_JOB_ID", "IRIS_REPLICA_INDEX", "IRIS_ANYTHING_NEW"])
    def test_iris_names_are_reserved_for_the_backends(self, name):
        # Issue 11: a job that set IRIS_JOB_NONCE escaped the reaper and kept its GPUs.
        found = problems(env={name: "x", "MINE": "y"})
        assert found == {
            "env": f"{name}: names starting with IRIS_ are reserved for what the backend sets (the job's id, "
            "incarnation, replica and devices); use another name"
        }

    def test_names_are_case_sensitive_so_other_spellings_are_the_jobs_own(self):
        assert parse_job({"job_id": "/a/b", "env": {"iris_job_nonce": "x", "MY_IRIS_X": "y"}}).env["MY_IRIS_X"] == "y"

    def test_names_are_letters_digits_and_underscores(self):
        assert "invalid variable name(s) '1BAD', 'A-B'" in problems(env={"1BAD": "x", "A-B": "y"})["env"]


class TestSizes:
    @pytest.mark.parametrize(
        ("fields", "path", "message"),
        [
            ({"command": ["x"] * (MAX_COMMAND_ARGUMENTS + 1)}, "command", "must have at most 4096 items"),
            ({"command": ["x" * (MAX_ARGUMENT_BYTES + 1)]}, "command", "argument 0 is longer than 131071 bytes"),
            ({"env": {f"V{i}": "" for i in range(MAX_ENV_VARIABLES + 1)}}, "env", "must have at most 1024 items"),
            ({"env": {"V": "x" * MAX_ARGUMENT_BYTES}}, "env", "V is longer than 131071 bytes with its name"),
            (
                {"command": ["x" * 100_000] * 6, "env": {f"V{i}": "y" * 100_000 for i in range(5)}},
                "env",
                "at most 1048576 can start a process",
            ),
            ({"image": "x" * 1025}, "image", "must be at most 1024 characters"),
            ({"regions": ["r"] * 65}, "regions", "must have at most 64 items"),
            ({"regions": ["r" * 257]}, "regions", "at most 256 characters"),
            ({"target_cluster": "c" * 257}, "target_cluster", "at most 256 characters"),
            ({"constraints": [{"key": "zone", "op": "EQ", "value": "z"}] * (MAX_CONSTRAINTS + 1)}, "constraints", "64"),
            ({"constraints": [{"key": "zone", "op": "IN", "values": ["z"] * 257}]}, "constraints[0].values", "256"),
            ({"constraints": [{"key": "zone", "op": "EQ", "value": "z" * 257}]}, "constraints[0].values", "256"),
            ({"constraints": [{"key": "k" * 257, "op": "EXISTS"}]}, "constraints[0].key", "256"),
        ],
    )
    def test_every_input_is_bounded(self, fields, path, message):
        found = problems(**fields)
        assert message in found[path], found


class TestErrorsAreSafeToShow:
    """Found by the fuzz: an input key holding a lone surrogate or a control character broke the error."""

    def test_an_unknown_field_is_named_escaped(self):
        found = problems(**{"\ud800": 1, "x\x1b": 2})
        assert found[""].startswith("unknown field(s) '\\ud800', 'x\\x1b'; accepted: job_id,")
        found[""].encode("utf-8")

    def test_a_bad_key_in_a_path_is_escaped(self):
        assert problems(env={"\x1f": 0}) == {"env.'\\x1f'": "must be a string"}

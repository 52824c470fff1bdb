"""Packing a local directory into a job's workdir files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iris_airflow_provider.core.job_files import file_bytes
from iris_airflow_provider.core.limits import MAX_FILES, MAX_FILES_BYTES
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.operators.workdir import WorkdirError, pack_workdir


def write(root: Path, name: str, data: bytes | str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def test_text_travels_as_text_and_anything_else_as_base64_byte_for_byte(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "print('hi')\n")
    write(tmp_path, "data/weights.bin", bytes(range(256)))
    write(tmp_path, "tricky.txt", "base64:not really")
    files = pack_workdir(tmp_path)
    assert list(files) == ["data/weights.bin", "train.py", "tricky.txt"]
    assert files["train.py"] == "print('hi')\n"
    assert files["data/weights.bin"].startswith("base64:")
    assert file_bytes(files["data/weights.bin"]) == bytes(range(256))
    assert file_bytes(files["tricky.txt"]) == b"base64:not really"  # not mistaken for encoded bytes
    assert parse_job({"job_id": "/a/b", "files": files}).files == files  # a valid job's files


def test_version_control_caches_and_links_out_of_the_directory_stay_behind(tmp_path: Path) -> None:
    root = tmp_path / "code"
    write(root, "main.py", "x = 1\n")
    write(root, ".git/HEAD", "ref: refs/heads/main\n")
    write(root, "pkg/__pycache__/main.cpython-311.pyc", b"\x00")
    write(root, "pkg/old.pyc", b"\x00")
    write(tmp_path, "secret.txt", "outside\n")
    os.symlink(tmp_path / "secret.txt", root / "leak.txt")
    os.symlink(root / "main.py", root / "alias.py")  # inside: it travels as a copy
    assert pack_workdir(root) == {"alias.py": "x = 1\n", "main.py": "x = 1\n"}


def test_a_path_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match=r"workdir: '.*missing' is not a directory"):
        pack_workdir(tmp_path / "missing")


def test_too_many_files_are_refused_naming_the_limit(tmp_path: Path) -> None:
    for index in range(MAX_FILES + 1):
        write(tmp_path, f"f{index:04d}.txt", "x")
    with pytest.raises(WorkdirError, match=f"more than {MAX_FILES} files"):
        pack_workdir(tmp_path)


def test_too_many_bytes_are_refused_naming_the_largest_files(tmp_path: Path) -> None:
    write(tmp_path, "big.bin", b"\x00" * MAX_FILES_BYTES)
    write(tmp_path, "small.txt", "x")
    with pytest.raises(WorkdirError) as caught:
        pack_workdir(tmp_path)
    assert f"holds {MAX_FILES_BYTES + 1} bytes" in str(caught.value)
    assert f"largest: big.bin ({MAX_FILES_BYTES} bytes), small.txt (1 bytes)" in str(caught.value)

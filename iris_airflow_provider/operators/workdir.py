"""Pack a local directory into a job's workdir ``files``, so the code a job runs travels with it.

A peer cannot read this deployment's disks, so the directory goes inline with the handoff (as the
reference carries its bundle), within the limits of a job's ``files``. Text files go as text,
anything else as ``base64:``. Version-control and cache directories are left out, and so is any
symlink that leads outside the directory.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from iris_airflow_provider.core.job_files import BASE64_PREFIX
from iris_airflow_provider.core.limits import MAX_FILES, MAX_FILES_BYTES

SKIPPED_DIRECTORIES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    }
)
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class WorkdirError(ValueError):
    """The directory cannot travel with the job; the message names it and says why."""


def pack_workdir(directory: str | Path) -> dict[str, str]:
    """Every file under ``directory`` as ``{relative path: content}``, in path order.

    Skipped directories are never entered, and the limits are checked on file sizes before any
    file is read, so a directory that cannot travel is refused without loading it.
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise WorkdirError(f"workdir: {str(directory)!r} is not a directory")
    root = root.resolve()
    sizes: dict[str, int] = {}
    paths: dict[str, Path] = {}
    for folder, subfolders, names in os.walk(root, followlinks=False):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_DIRECTORIES]
        for name in names:
            path = Path(folder) / name
            if path.suffix in SKIPPED_SUFFIXES:
                continue
            if not path.resolve().is_relative_to(root) or not path.is_file():
                continue  # a link out of the workdir (it would not exist on the peer), or not a file
            relative = path.relative_to(root).as_posix()
            sizes[relative], paths[relative] = path.stat().st_size, path
            if len(sizes) > MAX_FILES:
                raise WorkdirError(
                    f"workdir: {str(directory)!r} holds more than {MAX_FILES} files; "
                    f"at most {MAX_FILES} travel with a job"
                )
    total = sum(sizes.values())
    if total > MAX_FILES_BYTES:
        largest = ", ".join(f"{name} ({size} bytes)" for name, size in sorted(sizes.items(), key=lambda i: -i[1])[:3])
        raise WorkdirError(
            f"workdir: {str(directory)!r} holds {total} bytes, more than the {MAX_FILES_BYTES} that travel with a "
            f"job (largest: {largest}); put large inputs in an object store the peer can read"
        )
    return {name: _content(paths[name].read_bytes()) for name in sorted(paths)}


def _content(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return BASE64_PREFIX + base64.b64encode(data).decode()
    # Text that looks like the base64 marker is encoded too, or it would be decoded on arrival.
    return BASE64_PREFIX + base64.b64encode(data).decode() if text.startswith(BASE64_PREFIX) else text

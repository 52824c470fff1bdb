"""Pack a local directory into a job's workdir, so the code a job runs travels with it.

A peer cannot read this deployment's disks, so the directory travels with the handoff: inline as
the job's ``files`` (text files as text, anything else as ``base64:``) when it fits their limits,
else as a content-addressed bundle (``core/bundles.py``) packed into this cluster's bundle store and
uploaded to the cluster that runs the job. Version-control and cache directories are left out, and
so is any symlink that leads outside the directory.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundles import BundleEntry, BundleError, BundleRef, bundle_size
from iris_airflow_provider.core.job_files import BASE64_PREFIX, file_bytes
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


class WorkdirTooLargeError(WorkdirError):
    """The directory is over the limits of inline ``files``: it can travel as a bundle."""


def _root(directory: str | Path) -> Path:
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise WorkdirError(f"workdir: {str(directory)!r} is not a directory")
    return root.resolve()


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file that travels, in no particular order."""
    for folder, subfolders, names in os.walk(root, followlinks=False):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_DIRECTORIES]
        for name in names:
            path = Path(folder) / name
            if path.suffix in SKIPPED_SUFFIXES:
                continue
            if not path.resolve().is_relative_to(root) or not path.is_file():
                continue  # a link out of the workdir (it would not exist on the peer), or not a file
            yield path.relative_to(root).as_posix(), path


def pack_workdir(directory: str | Path) -> dict[str, str]:
    """Every file under ``directory`` as ``{relative path: content}``, in path order.

    Skipped directories are never entered, and the limits are checked on file sizes before any
    file is read, so a directory that cannot travel is refused without loading it.
    """
    root = _root(directory)
    sizes: dict[str, int] = {}
    paths: dict[str, Path] = {}
    for relative, path in _walk(root):
        sizes[relative], paths[relative] = path.stat().st_size, path
        if len(sizes) > MAX_FILES:
            raise WorkdirTooLargeError(
                f"workdir: {str(directory)!r} holds more than {MAX_FILES} files; at most {MAX_FILES} travel with a job"
            )
    total = sum(sizes.values())
    if total > MAX_FILES_BYTES:
        largest = ", ".join(f"{name} ({size} bytes)" for name, size in sorted(sizes.items(), key=lambda i: -i[1])[:3])
        raise WorkdirTooLargeError(
            f"workdir: {str(directory)!r} holds {total} bytes, more than the {MAX_FILES_BYTES} that travel with a "
            f"job (largest: {largest}); put large inputs in an object store the peer can read"
        )
    return {name: _content(paths[name].read_bytes()) for name in sorted(paths)}


def bundle_workdir(directory: str | Path, store: BundleStore, files: Mapping[str, str] | None = None) -> BundleRef:
    """Pack every file under ``directory``, with the job's own ``files`` over them, into ``store`` as
    one deterministic bundle, and return its reference. The size is checked before any file is read."""
    root = _root(directory)
    paths = dict(_walk(root))
    own = {path: file_bytes(content) for path, content in (files or {}).items()}
    for path in own:  # a job's own file wins over the directory's, and over a directory or file in its way
        paths.pop(path, None)
        segments = path.split("/")
        for depth in range(1, len(segments)):
            paths.pop("/".join(segments[:depth]), None)
        for other in [p for p in paths if p.startswith(path + "/")]:
            del paths[other]
    entries = [
        BundleEntry(relative, path.stat().st_size, os.access(path, os.X_OK), partial(_read, path))
        for relative, path in paths.items()
    ]
    entries += [BundleEntry(path, len(data), False, partial(iter, (data,))) for path, data in own.items()]
    size = bundle_size((entry.path, entry.size) for entry in entries)
    if size > store.max_bundle_bytes:
        raise WorkdirError(
            f"workdir: {str(directory)!r} makes a bundle of {size} bytes, more than the {store.max_bundle_bytes} this "
            "cluster takes (bundles.max_bundle_bytes in the cluster file); put large inputs in an object store"
        )
    try:
        return store.pack(entries)
    except BundleError as error:
        raise WorkdirError(f"workdir: {str(directory)!r}: {error}") from None


def _read(path: Path, block: int = 2**20) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while data := handle.read(block):
            yield data


def _content(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return BASE64_PREFIX + base64.b64encode(data).decode()
    # Text that looks like the base64 marker is encoded too, or it would be decoded on arrival.
    return BASE64_PREFIX + base64.b64encode(data).decode() if text.startswith(BASE64_PREFIX) else text

"""A workdir bundle: a job's workdir as one content-addressed archive, for workdirs too big to travel inline.

A job's ``files`` travel inline with its handoff up to ``core/limits.py``'s limits (256 files,
10 MiB). A bigger workdir travels as a *bundle*: a tar archive of its files whose bytes depend on
the tree alone, named by the sha256 of those bytes (``sha256:<hex>``). The job spec then carries a
:class:`BundleRef` (digest and size) instead of the files; the bundle is uploaded once to each
cluster that runs the job and unpacked into its working directory there.

The archive is deterministic: the same files with the same contents give the same bytes, whatever
their order on disk, their mtimes, owners or permission bits. Entries are regular files only (the
directories are implied by the paths, as for ``files``), in order of their UTF-8 paths, in the PAX
format (long and non-ASCII names), with mtime 0, uid and gid 0, no owner names, and mode 0644, or
0755 when the file is executable (a script the job runs keeps its ``x`` bit).

Everything here is pure: the archive is produced from entries whose bytes the caller reads
(:func:`archive_chunks`), and a received archive's members are judged (:func:`member_problem`)
before the caller writes any of them.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from iris_airflow_provider.core.job_files import file_path_problem
from iris_airflow_provider.core.strict_model import StrictModel

DIGEST_ALGORITHM = "sha256"
DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
# The largest bundle any cluster may be configured to take: a workdir is code and inputs, not a
# dataset (those belong in an object store the job reads).
MAX_BUNDLE_BYTES_CEILING = 64 * 2**30
DEFAULT_MAX_BUNDLE_BYTES = 1 * 2**30  # what a cluster takes unless its cluster file says otherwise
DEFAULT_CHUNK_BYTES = 8 * 2**20  # the most one upload request carries unless configured
MAX_CHUNK_BYTES_CEILING = 256 * 2**20
MAX_BUNDLE_MEMBERS = 1_000_000

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_FILE_MODE = 0o644
_EXECUTABLE_MODE = 0o755


class BundleError(ValueError):
    """A workdir cannot be bundled, or a received bundle cannot be unpacked; the message says why."""


def check_digest(value: str) -> str:
    if not isinstance(value, str) or not DIGEST_PATTERN.fullmatch(value):
        raise PydanticCustomError(
            "bundle_digest", "must be sha256:<64 lowercase hex digits> (the sha256 of the bundle's bytes)"
        )
    return value


Digest = Annotated[str, Field(max_length=71)]


class BundleRef(StrictModel):
    """The bundle a job's workdir travels as: the sha256 of its bytes, and how many there are."""

    digest: Digest = Field(description="sha256:<hex> of the archive's bytes")
    size: int = Field(ge=1, le=MAX_BUNDLE_BYTES_CEILING, description="the archive's size in bytes")

    _check_digest = field_validator("digest")(check_digest)

    @property
    def hex(self) -> str:
        return hex_of(self.digest)


def digest_of(hex_digest: str) -> str:
    return f"{DIGEST_ALGORITHM}:{hex_digest}"


def hex_of(digest: str) -> str:
    return digest.removeprefix(f"{DIGEST_ALGORITHM}:")


@dataclass(frozen=True, slots=True)
class BundleEntry:
    """One workdir file to archive: its relative path, size, whether it is executable, and how to
    read its bytes (called once, while the archive is produced)."""

    path: str
    size: int
    executable: bool
    read: Callable[[], Iterable[bytes]]


def member_info(path: str, size: int, executable: bool) -> tarfile.TarInfo:
    """The normalised header of one file: nothing in it but its path, size and executable bit."""
    info = tarfile.TarInfo(path)
    info.size = size
    info.type = tarfile.REGTYPE
    info.mode = _EXECUTABLE_MODE if executable else _FILE_MODE
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def archive_order(paths: Iterable[str]) -> list[str]:
    """The order of a bundle's entries: by UTF-8 bytes of the path, the same on every machine."""
    return sorted(paths, key=lambda path: path.encode("utf-8", "surrogateescape"))


def archive_chunks(entries: Iterable[BundleEntry]) -> Iterator[bytes]:
    """The bundle's bytes, a piece at a time (never the whole archive at once).

    Raises BundleError when a path cannot be a workdir file, is given twice, or a file does not
    yield the size it was listed with (it changed while being packed)."""
    by_path: dict[str, BundleEntry] = {}
    for entry in entries:
        problem = file_path_problem(entry.path)
        if problem:
            raise BundleError(f"{entry.path!r} {problem}")
        if entry.path in by_path:
            raise BundleError(f"{entry.path!r} is listed twice")
        by_path[entry.path] = entry
    written = 0
    for path in archive_order(by_path):
        entry = by_path[path]
        header = member_info(path, entry.size, entry.executable).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield header
        written += len(header)
        size = 0
        for chunk in entry.read():
            size += len(chunk)
            if size > entry.size:
                break
            yield chunk
        if size != entry.size:
            raise BundleError(f"{path!r} changed while it was packed (listed with {entry.size} bytes, read {size})")
        padding = -entry.size % _BLOCK
        if padding:
            yield bytes(padding)
        written += entry.size + padding
    end = 2 * _BLOCK
    yield bytes(end + (-(written + end) % _RECORD))


def bundle_size(entries: Iterable[tuple[str, int]]) -> int:
    """The archive's size for files of these (path, size), without producing it: to refuse a
    workdir over the limit before reading any of it."""
    written = 0
    for path, size in entries:
        written += len(member_info(path, size, False).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        written += size + (-size % _BLOCK)
    end = 2 * _BLOCK
    return written + end + (-(written + end) % _RECORD)


def bundle_ref(chunks: Iterable[bytes]) -> BundleRef:
    """The reference of an archive given as its bytes, a piece at a time."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return BundleRef(digest=digest_of(digest.hexdigest()), size=size)


class MemberCheck:
    """Judges the members of a received bundle one by one, before any is written: only regular
    files whose paths could be workdir ``files``, each once, none a directory of another, at most
    ``MAX_BUNDLE_MEMBERS``. Links, devices and paths out of the workdir never reach a disk."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.directories: set[str] = set()

    def problem(self, member: tarfile.TarInfo) -> str | None:
        """What is wrong with ``member``, or None (it is then counted as seen)."""
        if not member.isreg():
            return f"{member.name!r} is not a regular file (only files travel in a bundle)"
        problem = file_path_problem(member.name)
        if problem:
            return f"{member.name!r} {problem}"
        if member.name in self.files or member.name in self.directories:
            return f"{member.name!r} appears twice, or is both a file and a directory"
        segments = member.name.split("/")
        parents = ["/".join(segments[:depth]) for depth in range(1, len(segments))]
        if clash := next((parent for parent in parents if parent in self.files), None):
            return f"{member.name!r} is inside {clash!r}, which is a file"
        if len(self.files) >= MAX_BUNDLE_MEMBERS:
            return f"the bundle holds more than {MAX_BUNDLE_MEMBERS} files"
        self.files.add(member.name)
        self.directories.update(parents)
        return None


def is_executable(member: tarfile.TarInfo) -> bool:
    return bool(member.mode & 0o111)


@dataclass(frozen=True, slots=True)
class UploadStep:
    """What an uploader sends next: ``length`` bytes from ``offset`` (``length`` 0: nothing, done)."""

    offset: int
    length: int


def next_upload_step(received: int, size: int, chunk_bytes: int) -> UploadStep:
    """Resume from what the receiver already has: the next chunk after ``received`` bytes."""
    if received < 0 or received > size:
        raise BundleError(f"the receiver reports {received} bytes of a {size}-byte bundle")
    return UploadStep(received, min(chunk_bytes, size - received))


def upload_problem(*, offset: int, length: int, received: int, size: int, max_chunk_bytes: int) -> str | None:
    """Why the receiver refuses a chunk, or None: it must continue exactly where the upload stands,
    stay within the bundle, and be at most ``max_chunk_bytes``."""
    if offset != received:
        return f"offset {offset} does not continue the upload, which holds {received} bytes: send from {received}"
    if length > max_chunk_bytes:
        return f"a chunk may be at most {max_chunk_bytes} bytes"
    if offset + length > size:
        return f"the chunk ends at byte {offset + length}, past the bundle's size {size}"
    return None

"""A cluster's bundle store: workdir bundles (``core/bundles.py``) kept on local disk by digest.

The parent packs a job's workdir into it at submit; a peer receives uploads into its own, a chunk
at a time, and verifies the digest once the last byte is in; a backend unpacks a job's bundle from
it into the job's working directory. Layout, under the store's directory::

    sha256/<hex>            complete bundles, each verified against its name
    partial/<hex>-<size>    uploads in progress: a prefix of the bundle (of <size> bytes once
                            whole), appended to in order; created empty when the upload is admitted

Nothing is ever held whole in memory: packing, receiving, verifying and unpacking stream. An
upload is appended to by one writer at a time (an exclusive ``flock`` on its partial file, across
processes and api-server workers); another writer is refused and asks again. New uploads are
admitted one at a time (``admitting``, an exclusive ``flock``), each promised its room by its
partial file, so that several at once cannot take the store past its budget.

Bundles do not stay forever: each use (``has``, ``unpack``, ``complete``, ``pack``) touches the
bundle's mtime, and the placement tick lets go what ``core/bundle_retention.py`` says
(``backends/bundle_collection.py`` lists and deletes).

A store elsewhere (``bundle_store: gs://bucket/prefix`` for a Kubernetes backend) would offer the
same :class:`BundleSource` to the backend that reads it; it is cleaned by a bucket lifecycle rule.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from pydantic import Field, model_validator

from iris_airflow_provider.core.bundle_retention import (
    BUDGET_GRACE_MS,
    DEFAULT_KEEP_PARTIAL_SECONDS,
    DEFAULT_KEEP_UNUSED_SECONDS,
    DEFAULT_MAX_TOTAL_BYTES,
    MAX_TOTAL_BYTES_CEILING,
    RetentionRules,
)
from iris_airflow_provider.core.bundles import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_BUNDLE_BYTES,
    MAX_BUNDLE_BYTES_CEILING,
    MAX_CHUNK_BYTES_CEILING,
    BundleEntry,
    BundleError,
    BundleRef,
    MemberCheck,
    archive_chunks,
    digest_of,
    is_executable,
    upload_problem,
)
from iris_airflow_provider.core.strict_model import StrictModel

_READ_BYTES = 1 * 2**20


class BundleSettings(StrictModel):
    """The cluster file's ``bundles:`` block: where this cluster keeps workdir bundles and how large
    a one it packs, receives and runs."""

    dir: Path | None = Field(default=None, description="default: <state_dir>/bundles")
    max_bundle_bytes: int = Field(
        default=DEFAULT_MAX_BUNDLE_BYTES,
        ge=1,
        le=MAX_BUNDLE_BYTES_CEILING,
        description="the largest workdir bundle this cluster packs or accepts (default 1 GiB)",
    )
    chunk_bytes: int = Field(
        default=DEFAULT_CHUNK_BYTES,
        ge=64 * 2**10,
        le=MAX_CHUNK_BYTES_CEILING,
        description="the most one upload request carries: sent by this cluster, accepted from peers (default 8 MiB)",
    )
    max_total_bytes: int = Field(
        default=DEFAULT_MAX_TOTAL_BYTES,
        ge=1,
        le=MAX_TOTAL_BYTES_CEILING,
        description="what the store may hold: past it, least recently used unreferenced bundles go and new "
        "uploads that cannot fit are refused (default 50 GiB)",
    )
    keep_unused_seconds: float = Field(
        default=DEFAULT_KEEP_UNUSED_SECONDS,
        ge=BUDGET_GRACE_MS / 1000,
        le=365 * 86_400,
        description="a bundle no live job refers to goes once unused this long (default 1 day)",
    )
    keep_partial_seconds: float = Field(
        default=DEFAULT_KEEP_PARTIAL_SECONDS,
        ge=60,
        le=30 * 86_400,
        description="an upload nobody wrote to for this long is abandoned and goes (default 1 hour)",
    )

    @model_validator(mode="after")
    def _room_for_one_bundle(self) -> BundleSettings:
        if self.max_total_bytes < self.max_bundle_bytes:
            raise ValueError(
                f"bundles.max_total_bytes ({self.max_total_bytes}) must be at least bundles.max_bundle_bytes "
                f"({self.max_bundle_bytes}): the store could not hold the largest bundle this cluster takes"
            )
        return self

    @property
    def retention(self) -> RetentionRules:
        return RetentionRules(
            keep_unused_ms=int(self.keep_unused_seconds * 1000),
            keep_partial_ms=int(self.keep_partial_seconds * 1000),
            max_total_bytes=self.max_total_bytes,
        )

    def store(self, default_dir: Path) -> BundleStore:
        return BundleStore(
            self.dir or default_dir, max_bundle_bytes=self.max_bundle_bytes, chunk_bytes=self.chunk_bytes
        )


class BundleSource(Protocol):
    """Where a backend reads the bundles it unpacks, and how large a one it takes."""

    max_bundle_bytes: int

    def has(self, ref: BundleRef) -> bool: ...

    def unpack(self, ref: BundleRef, destination: Path) -> None: ...


def bundle_limit(backend: object) -> int:
    """The largest bundle ``backend`` can receive: 0 for a backend that takes none (it has no store)."""
    return int(getattr(backend, "max_bundle_bytes", 0) or 0)


class UploadConflictError(Exception):
    """Another writer is appending to the same bundle right now, or the chunk does not continue it."""


class DigestMismatchError(BundleError):
    """The bytes received do not hash to the bundle's digest: the upload was discarded."""


@dataclass
class Upload:
    """One chunk being appended to a partial bundle (its writer holds the partial file's lock)."""

    ref: BundleRef
    handle: BinaryIO
    received: int
    limit: int  # the chunk may not take the upload past this

    def write(self, chunk: bytes) -> None:
        if self.received + len(chunk) > self.limit:
            raise BundleError(f"the chunk is longer than announced: it would pass byte {self.limit}")
        self.handle.write(chunk)
        self.received += len(chunk)


class BundleStore:
    def __init__(
        self,
        directory: str | Path,
        *,
        max_bundle_bytes: int = DEFAULT_MAX_BUNDLE_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.directory = Path(directory)
        self.max_bundle_bytes = max_bundle_bytes
        self.chunk_bytes = chunk_bytes

    # Where things are ---------------------------------------------------------------------------

    @property
    def complete_dir(self) -> Path:
        return self.directory / "sha256"

    @property
    def partial_dir(self) -> Path:
        return self.directory / "partial"

    def path(self, ref: BundleRef) -> Path:
        return self.complete_dir / ref.hex

    def partial_path(self, ref: BundleRef) -> Path:
        return self.partial_dir / f"{ref.hex}-{ref.size}"

    def has(self, ref: BundleRef) -> bool:
        """Whether the bundle is here, complete; asking is a use (it keeps the bundle)."""
        path = self.path(ref)
        try:
            # Touch first: a collector that renamed it away before this sees no change and deletes
            # it (this answers False); one that renames it after sees the new mtime and puts it back.
            _touch(path)
            return path.stat().st_size == ref.size
        except FileNotFoundError:
            return False

    def peek(self, ref: BundleRef) -> bool:
        """Whether the bundle is here, complete, without using it."""
        try:
            return self.path(ref).stat().st_size == ref.size
        except FileNotFoundError:
            return False

    def received(self, ref: BundleRef) -> int:
        """How many bytes of the bundle are here: all of them once complete."""
        if self.peek(ref):
            return ref.size
        try:
            return min(self.partial_path(ref).stat().st_size, ref.size)
        except FileNotFoundError:
            return 0

    def is_uploading(self, ref: BundleRef) -> bool:
        """Whether an upload of the bundle has been admitted here (and not completed or let go)."""
        return self.partial_path(ref).exists()

    @contextmanager
    def admitting(self) -> Iterator[None]:
        r"""Held while a new upload is judged and, if admitted, :meth:`reserve`\ d: one at a time,
        across processes, so each is judged with the room promised to those before it."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        with (self.partial_dir / ".admitting").open("ab") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield

    def reserve(self, ref: BundleRef) -> None:
        """Admit an upload of the bundle: its (empty) partial file promises the bundle's room."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        self.partial_path(ref).touch()

    # The parent: packing a workdir ---------------------------------------------------------------

    def pack(self, entries: Iterable[BundleEntry]) -> BundleRef:
        """Archive ``entries`` into the store (streamed, hashed on the way) and return the reference."""
        self.complete_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        with tempfile.NamedTemporaryFile(dir=self.complete_dir, prefix=".packing-", delete=False) as out:
            try:
                for chunk in archive_chunks(entries):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if size > self.max_bundle_bytes:
                        raise BundleError(
                            f"the bundle is larger than the {self.max_bundle_bytes} bytes this cluster takes "
                            "(bundles.max_bundle_bytes)"
                        )
            except BaseException:
                os.unlink(out.name)
                raise
        ref = BundleRef(digest=digest_of(digest.hexdigest()), size=size)
        os.replace(out.name, self.path(ref))  # the same tree packed twice: the same name, the same bytes
        _touch(self.path(ref))
        return ref

    def read_chunk(self, ref: BundleRef, offset: int, length: int) -> bytes:
        with self.path(ref).open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)

    # A peer: receiving an upload -----------------------------------------------------------------

    @contextmanager
    def upload(self, ref: BundleRef, offset: int, length: int) -> Iterator[Upload]:
        """Append ``length`` bytes at ``offset`` of the bundle's partial file (the caller writes them);
        UploadConflictError when another writer holds it or ``offset`` is not where it stands. Bytes
        written before a cut connection stay: the next chunk continues after them."""
        partial = self.partial_path(ref)
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("ab") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UploadConflictError(f"bundle {ref.digest} is being uploaded by another request") from None
            _check_still_named(partial, handle, ref)
            received = os.fstat(handle.fileno()).st_size
            problem = upload_problem(
                offset=offset, length=length, received=received, size=ref.size, max_chunk_bytes=self.chunk_bytes
            )
            if problem:
                raise UploadConflictError(f"bundle {ref.digest}: {problem}")
            upload = Upload(ref, handle, received, offset + length)
            try:
                yield upload
            finally:
                handle.flush()

    def complete(self, ref: BundleRef) -> None:
        """Verify a fully received upload and keep it; DigestMismatchError (and the upload discarded)
        when its bytes are not the bundle's."""
        partial = self.partial_path(ref)
        try:
            handle = partial.open("rb")
        except FileNotFoundError:  # let go as abandoned since its last chunk: send it again
            raise UploadConflictError(f"bundle {ref.digest}: the upload is no longer here; send it again") from None
        with handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # no writer appends while it is judged
            _check_still_named(partial, handle, ref)
            digest = hashlib.sha256()
            size = 0
            while block := handle.read(_READ_BYTES):
                digest.update(block)
                size += len(block)
            actual = digest_of(digest.hexdigest())
            if size != ref.size or actual != ref.digest:
                partial.unlink(missing_ok=True)
                raise DigestMismatchError(
                    f"bundle {ref.digest}: the {size} bytes received hash to {actual}; the upload was discarded, "
                    "send it again"
                )
            self.complete_dir.mkdir(parents=True, exist_ok=True)
            os.replace(partial, self.path(ref))
            _touch(self.path(ref))

    # A backend: unpacking into a job's workdir ---------------------------------------------------

    def unpack(self, ref: BundleRef, destination: Path) -> None:
        """Write the bundle's files under ``destination`` (a new, empty workdir). Every member is
        judged before it is written (``core/bundles.py``): a bundle holding a link, a device or a
        path out of the workdir is refused, whoever made it."""
        check = MemberCheck()
        _touch(self.path(ref))
        with self.path(ref).open("rb") as raw, tarfile.open(fileobj=raw, mode="r|") as archive:
            for member in archive:
                problem = check.problem(member)
                if problem:
                    raise BundleError(f"bundle {ref.digest} cannot be unpacked: {problem}")
                target = destination / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None  # a regular file
                with target.open("xb") as output:
                    shutil.copyfileobj(source, output, _READ_BYTES)
                if is_executable(member):
                    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _touch(path: Path) -> None:
    """Mark a bundle used now (its mtime). FileNotFoundError when it is not here; a store another
    user owns and this one cannot write is left as it is (the bundle ages from its last touch)."""
    with suppress(PermissionError):
        os.utime(path)


def _check_still_named(path: Path, handle: BinaryIO, ref: BundleRef) -> None:
    """The locked partial file is still the one at ``path`` (not let go as abandoned meanwhile)."""
    info = os.fstat(handle.fileno())
    try:
        current = path.stat()
    except FileNotFoundError:
        current = None
    if current is None or (current.st_ino, current.st_dev) != (info.st_ino, info.st_dev):
        raise UploadConflictError(f"bundle {ref.digest}: the upload was let go meanwhile; ask where it stands")

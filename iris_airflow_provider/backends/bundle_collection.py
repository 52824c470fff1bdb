"""Letting go of bundles: the bundle store's entries as the retention rule reads them, and their deletion.

The rule (``core/bundle_retention.py``) decides; this lists the store (one directory listing for
complete bundles, one for partial uploads) and deletes what it chose, each deletion conditional on
the entry being as it was listed. An entry's last use is its mtime, in epoch milliseconds: every
use touches it (``BundleStore.has``, ``unpack``, ``complete``, ``pack``), every chunk written moves
a partial's. The rule compares it with the tick's clock (epoch milliseconds too), so a test that
moves the tick's clock ages the entries with it; nothing here reads the time.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundle_retention import PartialUpload, StoredBundle
from iris_airflow_provider.core.bundles import digest_of, hex_of

_HEX_DIGITS = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class StoreListing:
    """The store's entries as the retention rule reads them, with the mtimes they were listed at
    (a removal is conditional on them)."""

    bundles: tuple[StoredBundle, ...]
    partials: tuple[PartialUpload, ...]
    mtimes_ns: dict[Path, int]  # each entry's file -> its st_mtime_ns when listed


def list_store(store: BundleStore) -> StoreListing:
    """Every complete bundle and partial upload, each with its last use (one directory listing each)."""
    mtimes: dict[Path, int] = {}

    def scan(directory: Path) -> list[tuple[str, int, int]]:
        found = []
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return []
        for entry in entries:
            if len(entry.name) != 64 or not _HEX_DIGITS.issuperset(entry.name):
                continue  # a file being packed, or one being let go
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            mtimes[directory / entry.name] = info.st_mtime_ns
            found.append((digest_of(entry.name), info.st_size, info.st_mtime_ns // 1_000_000))
        return found

    return StoreListing(
        bundles=tuple(StoredBundle(*found) for found in scan(store.complete_dir)),
        partials=tuple(PartialUpload(*found) for found in scan(store.partial_dir)),
        mtimes_ns=mtimes,
    )


def mark_used(store: BundleStore, bundle: StoredBundle, now_ms: int) -> None:
    """Date a bundle a live job refers to ``now_ms`` (the caller's clock), so that its days unused
    count from the end of its last job."""
    stamp = now_ms * 1_000_000
    with suppress(FileNotFoundError, PermissionError):
        os.utime(store.complete_dir / hex_of(bundle.digest), ns=(stamp, stamp))


def remove_bundle(store: BundleStore, bundle: StoredBundle, listing: StoreListing) -> bool:
    """Delete a complete bundle if nobody used it since ``listing``. It is renamed away first
    and put back if its mtime moved: a reader that opened it keeps reading (POSIX), and one
    that asks for it in between is told it is not here (a peer then has it uploaded again)."""
    path = store.complete_dir / hex_of(bundle.digest)
    doomed = path.with_name(f".collecting-{path.name}-{uuid.uuid4().hex}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return False
    if doomed.stat().st_mtime_ns != listing.mtimes_ns.get(path):
        os.replace(doomed, path)  # used meanwhile: it stays (a copy stored meanwhile has the same bytes)
        return False
    doomed.unlink()
    return True


def remove_partial(store: BundleStore, partial: PartialUpload, listing: StoreListing) -> bool:
    """Delete an abandoned upload if no writer holds it and nothing was written since ``listing``."""
    path = store.partial_dir / hex_of(partial.digest)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a writer is appending right now: not abandoned
        info = os.fstat(handle.fileno())
        try:
            current = path.stat()
        except FileNotFoundError:
            return False
        if (current.st_ino, current.st_dev) != (info.st_ino, info.st_dev):
            return False  # completed, or started again, since it was listed
        if info.st_mtime_ns != listing.mtimes_ns.get(path):
            return False
        # Unlinked under the lock: a writer that opened it before finds, once it has the lock,
        # that the path no longer names its file, and asks again (``BundleStore.upload``).
        path.unlink()
        return True

"""Letting go of bundles: the bundle store's entries as the retention rule reads them, and their deletion.

The rule (``core/bundle_retention.py``) decides; this lists the store (one directory listing for
complete bundles and the stray files among them, one for partial uploads) and deletes what it
chose, each deletion conditional on the entry being as it was listed. An entry's last use is its
mtime, in epoch milliseconds: every use touches it (``BundleStore.has``, ``unpack``, ``complete``,
``pack``), every chunk written moves a partial's. The rule compares it with the tick's clock (epoch
milliseconds too), so a test that moves the tick's clock ages the entries with it; nothing here
reads the time.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundle_retention import PartialUpload, StoredBundle, StrayFile
from iris_airflow_provider.core.bundles import digest_of, hex_of

_HEX_DIGITS = frozenset("0123456789abcdef")
# What a packer (``BundleStore.pack``) or a collector (``remove_bundle``) writes beside the bundles
# for a moment: left behind only when it died.
STRAY_PREFIXES = (".packing-", ".collecting-")


@dataclass(frozen=True, slots=True)
class StoreListing:
    """The store's entries as the retention rule reads them, with the mtimes they were listed at
    (a removal is conditional on them)."""

    bundles: tuple[StoredBundle, ...]
    partials: tuple[PartialUpload, ...]
    mtimes_ns: dict[Path, int]  # each entry's file -> its st_mtime_ns when listed
    strays: tuple[StrayFile, ...] = ()


def list_store(store: BundleStore) -> StoreListing:
    """Every complete bundle, partial upload and stray file, each with its last use or write (one
    directory listing each for complete bundles and partial uploads)."""
    mtimes: dict[Path, int] = {}
    bundles: list[StoredBundle] = []
    partials: list[PartialUpload] = []
    strays: list[StrayFile] = []
    for entry, info in _entries(store.complete_dir):
        last_ms = info.st_mtime_ns // 1_000_000
        if _is_hex(entry.name):
            bundles.append(StoredBundle(digest_of(entry.name), info.st_size, last_ms))
        elif entry.name.startswith(STRAY_PREFIXES):
            strays.append(StrayFile(entry.name, info.st_size, last_ms))
        else:
            continue
        mtimes[store.complete_dir / entry.name] = info.st_mtime_ns
    for entry, info in _entries(store.partial_dir):
        hex_digest, _, declared = entry.name.partition("-")
        if not _is_hex(hex_digest) or not (declared.isdigit() or entry.name == hex_digest):
            continue  # the admission lock
        mtimes[store.partial_dir / entry.name] = info.st_mtime_ns
        last_ms = info.st_mtime_ns // 1_000_000
        partials.append(PartialUpload(digest_of(hex_digest), info.st_size, last_ms, int(declared or 0)))
    return StoreListing(tuple(bundles), tuple(partials), mtimes, tuple(strays))


def _is_hex(name: str) -> bool:
    return len(name) == 64 and _HEX_DIGITS.issuperset(name)


def _entries(directory: Path) -> list[tuple[os.DirEntry[str], os.stat_result]]:
    found = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            found.append((entry, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return found


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


def remove_stray(store: BundleStore, stray: StrayFile, listing: StoreListing) -> bool:
    """Delete a stray file if nothing wrote to it since ``listing`` (a live packer writes on)."""
    path = store.complete_dir / stray.name
    try:
        if path.stat().st_mtime_ns != listing.mtimes_ns.get(path):
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_partial(store: BundleStore, partial: PartialUpload, listing: StoreListing) -> bool:
    """Delete an abandoned upload if no writer holds it and nothing was written since ``listing``."""
    name = hex_of(partial.digest)
    path = store.partial_dir / (f"{name}-{partial.declared_size}" if partial.declared_size else name)
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

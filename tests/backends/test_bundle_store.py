"""A cluster's bundle store on a real disk: packing a workdir is deterministic, unpacking gives it back,
an upload resumes after a cut, is verified at the end, and has one writer at a time."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from iris_airflow_provider.backends.base import now_ms
from iris_airflow_provider.backends.bundle_collection import list_store, remove_bundle, remove_partial, remove_stray
from iris_airflow_provider.backends.bundles import BundleStore, DigestMismatchError, UploadConflictError
from iris_airflow_provider.core.bundles import BundleError, BundleRef
from iris_airflow_provider.operators.workdir import WorkdirError, bundle_workdir
from tests.waiting import wait_for


def write(root: Path, name: str, data: bytes, *, mtime: int = 0, mode: int = 0o644) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    if mtime:
        os.utime(path, (mtime, mtime))


FILES = {"train.py": b"print('train')\n", "run.sh": b"#!/bin/sh\necho run\n", "data/w.bin": os.urandom(300_000)}


def test_the_same_tree_made_differently_packs_to_the_same_digest(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for name, data in FILES.items():
        write(one, name, data, mtime=1_000_000, mode=0o755 if name == "run.sh" else 0o644)
    for name, data in reversed(FILES.items()):  # other creation order, mtimes, group/other bits
        write(two, name, data, mtime=2_000_000, mode=0o775 if name == "run.sh" else 0o600)
    write(two, ".git/HEAD", b"ref\n")  # left out, as for inline files
    store = BundleStore(tmp_path / "bundles")
    first, second = bundle_workdir(one, store), bundle_workdir(two, store)
    assert first == second
    assert store.has(first)
    assert "sha256:" + hashlib.sha256(store.path(first).read_bytes()).hexdigest() == first.digest
    assert bundle_workdir(one, store, {"train.py": "print('changed')\n"}) != first


def test_a_bundle_unpacks_to_the_workdir_with_its_executable_bits(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for name, data in FILES.items():
        write(source, name, data, mode=0o755 if name == "run.sh" else 0o644)
    store = BundleStore(tmp_path / "bundles")
    ref = bundle_workdir(source, store, {"params.txt": "lr=0.1\n"})
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    store.unpack(ref, workdir)
    unpacked = {p.relative_to(workdir).as_posix(): p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    assert unpacked == {**FILES, "params.txt": b"lr=0.1\n"}
    assert os.access(workdir / "run.sh", os.X_OK) and not os.access(workdir / "train.py", os.X_OK)


def test_a_workdir_over_the_clusters_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    write(tmp_path / "src", "big.bin", b"\0" * 100_000)
    store = BundleStore(tmp_path / "bundles", max_bundle_bytes=50_000)
    with pytest.raises(WorkdirError, match=r"more than the 50000 this cluster takes \(bundles.max_bundle_bytes"):
        bundle_workdir(tmp_path / "src", store)
    assert not (tmp_path / "bundles").exists()  # refused on the files' sizes, before packing any


def test_a_bundle_with_a_link_or_a_path_out_of_the_workdir_is_not_unpacked(tmp_path: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("escape")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    raw = data.getvalue()
    store = BundleStore(tmp_path / "bundles")
    ref = BundleRef(digest="sha256:" + hashlib.sha256(raw).hexdigest(), size=len(raw))
    store.path(ref).parent.mkdir(parents=True)
    store.path(ref).write_bytes(raw)
    (tmp_path / "workdir").mkdir()
    with pytest.raises(BundleError, match="'escape' is not a regular file"):
        store.unpack(ref, tmp_path / "workdir")
    assert list((tmp_path / "workdir").iterdir()) == []


def upload(store: BundleStore, ref: BundleRef, data: bytes, offset: int) -> int:
    with store.upload(ref, offset, len(data)) as chunk:
        chunk.write(data)
    return chunk.received


def test_an_upload_cut_part_way_resumes_from_what_arrived_and_is_verified(tmp_path: Path) -> None:
    payload = os.urandom(100_000)
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    store = BundleStore(tmp_path / "bundles", chunk_bytes=64 * 1024)
    assert store.received(ref) == 0

    def cut_mid_chunk() -> None:
        with store.upload(ref, 0, 64 * 1024) as chunk:
            chunk.write(payload[:10_000])
            raise ConnectionResetError  # the connection is cut mid-chunk

    with pytest.raises(ConnectionResetError):
        cut_mid_chunk()
    assert store.received(ref) == 10_000 and not store.has(ref)
    with pytest.raises(UploadConflictError, match="does not continue the upload, which holds 10000 bytes"):
        upload(store, ref, payload[: 64 * 1024], 0)
    assert upload(store, ref, payload[10_000:74_000], 10_000) == 74_000
    assert upload(store, ref, payload[74_000:], 74_000) == len(payload)
    store.complete(ref)
    assert store.has(ref) and store.received(ref) == len(payload)
    assert store.path(ref).read_bytes() == payload
    assert not store.partial_path(ref).exists()


def test_bytes_that_do_not_hash_to_the_digest_are_discarded(tmp_path: Path) -> None:
    payload = b"honest bytes"
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    store = BundleStore(tmp_path / "bundles")
    upload(store, ref, b"forged bytes", 0)
    with pytest.raises(DigestMismatchError, match="the upload was discarded"):
        store.complete(ref)
    assert store.received(ref) == 0 and not store.has(ref)


def test_one_writer_at_a_time_and_no_chunk_past_its_announced_length(tmp_path: Path) -> None:
    payload = os.urandom(1000)
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    store = BundleStore(tmp_path / "bundles")
    with store.upload(ref, 0, 500) as first:
        with pytest.raises(UploadConflictError, match="being uploaded by another request"):
            upload(store, ref, payload[:500], 0)
        with pytest.raises(BundleError, match="longer than announced"):
            first.write(payload[:501])
        first.write(payload[:500])
    assert store.received(ref) == 500


# Retention: uses touch, the listing dates entries on the caller's clock, deletions are conditional --


def stored(store: BundleStore, payload: bytes) -> BundleRef:
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    upload(store, ref, payload, 0)
    store.complete(ref)
    return ref


def age(path: Path, seconds: int) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_every_use_touches_a_bundle_and_the_listing_dates_its_last_use(tmp_path: Path) -> None:
    store = BundleStore(tmp_path / "bundles")
    write(tmp_path / "src", "train.py", b"print('train')\n")
    ref = bundle_workdir(tmp_path / "src", store)
    (store.directory / "sha256" / ".packing-abc").write_bytes(b"half packed")  # not an entry
    for use in (store.has, lambda r: store.unpack(r, Path(tempfile.mkdtemp(dir=tmp_path)))):
        age(store.path(ref), 7200)
        (listed,) = list_store(store).bundles
        assert listed.digest == ref.digest and listed.size == ref.size
        assert now_ms() - 7_205_000 <= listed.last_used_ms <= now_ms() - 7_195_000
        use(ref)
        (listed,) = list_store(store).bundles
        assert listed.last_used_ms >= now_ms() - 5_000
    age(store.path(ref), 7200)
    assert not store.peek(BundleRef(digest=ref.digest, size=ref.size + 1)) and store.received(ref) == ref.size
    assert list_store(store).bundles[0].last_used_ms <= now_ms() - 7_195_000  # peeking is no use


def test_a_bundle_goes_unless_it_was_used_after_the_listing_and_a_reader_keeps_reading(tmp_path: Path) -> None:
    store = BundleStore(tmp_path / "bundles")
    payload = os.urandom(200_000)
    ref = stored(store, payload)
    age(store.path(ref), 7200)
    listing = list_store(store)
    store.has(ref)  # used after the listing: it stays
    assert not remove_bundle(store, listing.bundles[0], listing)
    assert store.has(ref) and store.path(ref).read_bytes() == payload
    listing = list_store(store)
    with store.path(ref).open("rb") as reader:  # a job's unpack under way
        head = reader.read(1000)
        assert remove_bundle(store, listing.bundles[0], listing)
        assert head + reader.read() == payload
    assert not store.has(ref) and list(store.directory.joinpath("sha256").iterdir()) == []
    assert not remove_bundle(store, listing.bundles[0], listing)  # already gone


def test_an_upload_being_written_is_never_let_go_and_an_abandoned_one_is(tmp_path: Path) -> None:
    payload = os.urandom(1000)
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    store = BundleStore(tmp_path / "bundles")
    upload(store, ref, payload[:400], 0)
    listing = list_store(store)
    (partial,) = listing.partials
    assert partial.size == 400
    with store.upload(ref, 400, 300) as writing:
        assert not remove_partial(store, partial, listing)  # the writer holds it
        writing.write(payload[400:700])
    assert not remove_partial(store, partial, listing)  # written since it was listed
    assert upload(store, ref, payload[700:], 700) == 1000
    store.complete(ref)
    assert store.has(ref) and store.path(ref).read_bytes() == payload

    other = os.urandom(500)
    abandoned = BundleRef(digest="sha256:" + hashlib.sha256(other).hexdigest(), size=len(other))
    upload(store, abandoned, other[:100], 0)
    listing = list_store(store)
    assert remove_partial(store, listing.partials[0], listing)
    assert store.received(abandoned) == 0  # a parent asking again starts over: nothing is broken
    assert upload(store, abandoned, other, 0) == 500
    store.complete(abandoned)
    assert store.has(abandoned)


def test_the_listing_reads_each_uploads_declared_size_and_what_a_dead_packer_left(tmp_path: Path) -> None:
    store = BundleStore(tmp_path / "bundles")
    ref = BundleRef(digest="sha256:" + "ab" * 32, size=1000)
    store.reserve(ref)  # admitted: nothing sent yet, its room promised by its name
    assert store.is_uploading(ref) and store.received(ref) == 0
    assert upload(store, ref, b"x" * 100, 0) == 100
    legacy = store.partial_dir / ("cd" * 32)  # an upload begun before partial files named their size
    legacy.write_bytes(b"y" * 10)
    with store.admitting():  # its lock file is no entry
        pass
    store.complete_dir.mkdir(parents=True)
    dead, packing = store.complete_dir / ".packing-dead", store.complete_dir / ".packing-live"
    dead.write_bytes(b"z" * 7)
    packing.write_bytes(b"z" * 3)
    listing = list_store(store)
    assert sorted((p.digest, p.size, p.declared_size) for p in listing.partials) == [
        (ref.digest, 100, 1000),
        ("sha256:" + "cd" * 32, 10, 0),
    ]
    assert sorted((f.name, f.size) for f in listing.strays) == [(".packing-dead", 7), (".packing-live", 3)]
    assert listing.bundles == ()

    with packing.open("ab") as still_writing:
        still_writing.write(b"more")
        age(packing, -5)  # written since the listing (a clock a little ahead, to be sure it moved)
    strays = {f.name: f for f in listing.strays}
    assert not remove_stray(store, strays[".packing-live"], listing) and packing.exists()
    assert remove_stray(store, strays[".packing-dead"], listing) and not dead.exists()
    assert not remove_stray(store, strays[".packing-dead"], listing)  # already gone
    (old_style,) = [p for p in listing.partials if p.declared_size == 0]
    assert remove_partial(store, old_style, listing) and not legacy.exists()


def test_completing_an_upload_let_go_meanwhile_asks_the_sender_to_start_over(tmp_path: Path) -> None:
    """The collector holds the partial's lock; ``complete`` has opened the file and waits for the
    lock; the collector unlinks it: once ``complete`` has the lock it sees the path no longer names
    its file, and neither keeps the bytes nor crashes."""
    payload = os.urandom(1000)
    ref = BundleRef(digest="sha256:" + hashlib.sha256(payload).hexdigest(), size=len(payload))
    store = BundleStore(tmp_path / "bundles")
    upload(store, ref, payload, 0)
    partial = store.partial_path(ref)
    outcome: list[BaseException | None] = []

    def complete() -> None:
        try:
            store.complete(ref)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    with partial.open("rb") as collector:
        fcntl.flock(collector.fileno(), fcntl.LOCK_EX)
        finisher = threading.Thread(target=complete)
        finisher.start()
        wait_for(lambda: _opened_by_this_process(partial) >= 2, "complete() to open the partial upload")
        partial.unlink()
    finisher.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], UploadConflictError), outcome
    assert "let go meanwhile" in str(outcome[0])
    assert not store.has(ref) and store.received(ref) == 0


def _opened_by_this_process(path: Path) -> int:
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += os.readlink(fd) == str(path)
        except OSError:
            continue
    return count

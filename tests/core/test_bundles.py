"""Workdir bundles: the same tree always gives the same bytes and digest; references and members are judged."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.bundles import (
    BundleEntry,
    BundleError,
    MemberCheck,
    archive_chunks,
    bundle_ref,
    bundle_size,
    next_upload_step,
    upload_problem,
)
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.model import parse_job


def entry(path: str, data: bytes, executable: bool = False, pieces: int = 1) -> BundleEntry:
    step = max(1, len(data) // pieces)
    return BundleEntry(path, len(data), executable, lambda: [data[i : i + step] for i in range(0, len(data), step)])


TREE = {
    "train.py": b"print('hi')\n",
    "data/a.bin": bytes(range(256)) * 9,
    "data/b/c.txt": b"",
    "\u00e9t\u00e9.txt": b"x",
}


def archive(entries: list[BundleEntry]) -> bytes:
    return b"".join(archive_chunks(entries))


def test_the_same_tree_gives_the_same_bytes_whatever_the_order_and_how_it_is_read() -> None:
    forward = archive([entry(path, data) for path, data in TREE.items()])
    backward = archive([entry(path, data, pieces=7) for path, data in reversed(TREE.items())])
    assert forward == backward
    assert bundle_ref([forward]).digest == "sha256:" + hashlib.sha256(forward).hexdigest()
    assert bundle_ref([forward]).size == len(forward) == bundle_size((p, len(d)) for p, d in TREE.items())


def test_only_the_path_contents_and_executable_bit_are_kept() -> None:
    data = archive([entry("run.sh", b"echo hi\n", executable=True), entry("notes.txt", b"n")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["notes.txt", "run.sh"]  # sorted
        assert [(m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members] == [
            (0o644, 0, 0, 0, "", ""),
            (0o755, 0, 0, 0, "", ""),
        ]
        assert tar.extractfile("run.sh").read() == b"echo hi\n"  # type: ignore[union-attr]
    assert len(data) % tarfile.RECORDSIZE == 0


def test_a_different_byte_or_executable_bit_is_a_different_digest() -> None:
    base = bundle_ref(archive_chunks([entry("a", b"x")])).digest
    assert bundle_ref(archive_chunks([entry("a", b"y")])).digest != base
    assert bundle_ref(archive_chunks([entry("a", b"x", executable=True)])).digest != base


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="abc/é", min_size=1, max_size=12).filter(
            lambda p: all(s not in ("", ".", "..") for s in p.split("/"))
        ),
        st.binary(max_size=700),
        max_size=6,
    ).filter(lambda tree: not any(other.startswith(p + "/") for p in tree for other in tree)),
    st.randoms(use_true_random=False),
)
def test_any_tree_in_any_order_archives_identically_and_unpacks_to_itself(
    tree: dict[str, bytes], shuffler: random.Random
) -> None:
    entries = [entry(path, data) for path, data in tree.items()]
    shuffled = entries[:]
    shuffler.shuffle(shuffled)
    data = archive(entries)
    assert archive(shuffled) == data
    check = MemberCheck()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        unpacked = {}
        for member in tar:
            assert check.problem(member) is None
            unpacked[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    assert unpacked == tree


def test_a_file_that_changes_while_packed_or_a_bad_path_is_refused() -> None:
    with pytest.raises(BundleError, match=r"'a' changed while it was packed \(listed with 3 bytes, read 4\)"):
        archive([BundleEntry("a", 3, False, lambda: [b"four"])])
    with pytest.raises(BundleError, match=r"'../x' must not have empty"):
        archive([entry("../x", b"")])
    with pytest.raises(BundleError, match="listed twice"):
        archive([entry("x", b""), entry("x", b"")])


def member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def test_a_received_bundle_may_hold_only_workdir_files() -> None:
    check = MemberCheck()
    assert check.problem(member("a/b.txt")) is None
    assert (
        check.problem(member("link", tarfile.SYMTYPE)) == "'link' is not a regular file (only files travel in a bundle)"
    )
    assert check.problem(member("dir", tarfile.DIRTYPE)) is not None
    assert check.problem(member("/etc/passwd")) == "'/etc/passwd' must be a relative path inside the job's workdir"
    assert check.problem(member("a/../../x")) == "'a/../../x' must not have empty, '.' or '..' segments"
    assert check.problem(member("a/b.txt")) == "'a/b.txt' appears twice, or is both a file and a directory"
    assert check.problem(member("a")) == "'a' appears twice, or is both a file and a directory"
    assert check.problem(member("a/b.txt/c")) == "'a/b.txt/c' is inside 'a/b.txt', which is a file"


def test_a_job_names_its_bundle_by_digest_and_size_and_not_with_files() -> None:
    digest = "sha256:" + "0" * 64
    spec = parse_job({"job_id": "/a/b", "bundle": {"digest": digest, "size": 10}})
    assert spec.bundle is not None and spec.bundle.hex == "0" * 64
    with pytest.raises(SpecError) as caught:
        parse_job({"job_id": "/a/b", "bundle": {"digest": "md5:abc", "size": 0}}, path="job")
    text = str(caught.value)
    assert "job.bundle.digest: must be sha256:<64 lowercase hex digits>" in text
    assert "job.bundle.size: must be >= 1" in text
    with pytest.raises(SpecError, match=r"job\.bundle: .*give files or a bundle, not both"):
        parse_job({"job_id": "/a/b", "files": {"x": "1"}, "bundle": {"digest": digest, "size": 1}}, path="job")


def test_an_upload_resumes_where_the_receiver_stands_and_refuses_anything_else() -> None:
    assert next_upload_step(0, 10, 4) == next_upload_step(0, 10, 4)
    assert (next_upload_step(8, 10, 4).offset, next_upload_step(8, 10, 4).length) == (8, 2)
    assert next_upload_step(10, 10, 4).length == 0
    with pytest.raises(BundleError):
        next_upload_step(11, 10, 4)
    assert upload_problem(offset=4, length=4, received=4, size=10, max_chunk_bytes=4) is None
    assert "send from 6" in str(upload_problem(offset=4, length=4, received=6, size=10, max_chunk_bytes=4))
    assert "at most 4 bytes" in str(upload_problem(offset=4, length=5, received=4, size=10, max_chunk_bytes=4))
    assert "past the bundle's size 10" in str(
        upload_problem(offset=8, length=4, received=8, size=10, max_chunk_bytes=4)
    )

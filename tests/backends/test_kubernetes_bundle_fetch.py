"""The bundle init container's program against a real GCS emulator (fake-gcs-server): it unpacks
exactly the archive it was submitted with, and refuses a different or unsafe one, unpacking nothing."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest

from iris_airflow_provider.backends.kubernetes import bundle_fetch

SOURCE = Path(bundle_fetch.__file__).read_text()


def archive(members: dict[str, bytes], *, link: tuple[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return buffer.getvalue()


def upload(gcs, name: str, data: bytes) -> str:
    request = urllib.request.Request(
        f"{gcs.url}/upload/storage/v1/b/iris-bundles/o?uploadType=media&name={name}", data=data, method="POST"
    )
    urllib.request.urlopen(request, timeout=30).close()
    return f"gs://iris-bundles/{name}"


def fetch(gcs, url: str, digest: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "STORAGE_EMULATOR_HOST": gcs.url,
        "IRIS_BUNDLE_URL": url,
        "IRIS_BUNDLE_DIGEST": digest,
        "IRIS_BUNDLE_DIR": str(workdir),
    }
    # As the init container runs it: the module's source as the program, the standard library only.
    return subprocess.run([sys.executable, "-I", "-c", SOURCE], env=env, capture_output=True, text=True, timeout=120)


def test_unpacks_the_submitted_archive(gcs_emulator, tmp_path: Path) -> None:
    data = archive({"train.py": b"print('hi')\n", "data/shard-0": os.urandom(3 << 20)})
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    url = upload(gcs_emulator, f"prefix/sha256/{digest[7:]}", data)

    done = fetch(gcs_emulator, url, digest, tmp_path / "workdir")

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "workdir/train.py").read_bytes() == b"print('hi')\n"
    assert (tmp_path / "workdir/data/shard-0").stat().st_size == 3 << 20
    assert [p.name for p in (tmp_path / "workdir").iterdir() if p.name.startswith(".bundle-")] == []


def test_a_different_archive_is_refused_and_nothing_unpacked(gcs_emulator, tmp_path: Path) -> None:
    data = archive({"train.py": b"print('tampered')\n"})
    url = upload(gcs_emulator, "prefix/swapped.tar", data)

    done = fetch(gcs_emulator, url, "sha256:" + hashlib.sha256(b"what was submitted").hexdigest(), tmp_path / "workdir")

    assert done.returncode == 2
    assert "is not the submitted" in done.stderr
    assert list((tmp_path / "workdir").iterdir()) == []


@pytest.mark.parametrize(
    ("members", "link"),
    [({"../escape.py": b"x"}, None), ({"ok.py": b"x"}, ("out", "/etc/passwd"))],
    ids=["parent-path", "link-out"],
)
def test_an_unsafe_archive_is_refused(gcs_emulator, tmp_path: Path, members, link) -> None:
    data = archive(members, link=link)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    url = upload(gcs_emulator, f"prefix/sha256/{digest[7:]}", data)

    done = fetch(gcs_emulator, url, digest, tmp_path / "workdir")

    assert done.returncode == 3, done.stderr
    assert "unsafe archive" in done.stderr
    assert not (tmp_path / "escape.py").exists()
    assert list((tmp_path / "workdir").iterdir()) == []  # judged whole: not even ok.py


def test_a_missing_object_fails_naming_it(gcs_emulator, tmp_path: Path) -> None:
    done = fetch(gcs_emulator, "gs://iris-bundles/prefix/absent.tar", "sha256:" + "0" * 64, tmp_path / "workdir")

    assert done.returncode == 1
    assert "HTTP 404" in done.stderr and "absent.tar" in done.stderr

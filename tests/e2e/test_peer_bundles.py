"""A 200 MiB workdir reaches an Airflow peer as a bundle, and the job reads it there.

The pair ``test_peer_federation`` uses too (``tests/e2e/shared_federation.py``: parent ``marin``,
peer ``cw-east``, real api-servers, schedulers and triggerers on PostgreSQL, the peer API through a
loopback proxy) with the default ``bundles:`` settings on both sides. The test writes a workdir of
200 MiB of random bytes (cheap to make, impossible to compress), submits a DAG whose ``workdir=``
names it, and checks the sha256 the job computes of the file on the peer. A second submission of
the same workdir uploads nothing. Then a 200 MiB upload straight to the peer's api-server is timed,
with the api-server's peak RSS.
"""

from __future__ import annotations

import hashlib
import os
import time
from functools import partial
from pathlib import Path

import pytest

from devtools.airflow_deployment import _descendants
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundles import BundleEntry
from iris_airflow_provider.peers.airflow_peer import AirflowPeer
from iris_airflow_provider.peers.identity import TokenMinter
from tests.e2e.jobs import job_of
from tests.e2e.shared_federation import Federation
from tests.e2e.test_peer_federation import gpu, on_peer
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e
_wait = partial(wait_for, timeout=120, interval=0.5)

MiB = 2**20
SIZE = 200 * MiB


def write_random(path: Path, size: int) -> str:
    """``size`` random bytes at ``path``, written a piece at a time; their sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(size // (8 * MiB)):
            piece = os.urandom(8 * MiB)
            digest.update(piece)
            out.write(piece)
    return digest.hexdigest()


def peak_rss_kib(pid: int) -> int:
    """The largest resident set a process and its descendants have had (VmHWM), summed, in KiB."""
    total = 0
    for each in (pid, *_descendants(pid)):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return total


def test_a_200_mib_workdir_reaches_the_peer_and_the_job_reads_it(federation: Federation, tmp_path: Path) -> None:
    parent = federation.parent
    workdir = tmp_path / "workdir"
    expected = write_random(workdir / "data" / "weights.bin", SIZE)
    (workdir / "check.sh").write_text("sha256sum data/weights.bin\n")
    job = gpu("sh check.sh")
    run = parent.trigger("e2e_bundle", {"job": job, "workdir": str(workdir)}, user="alice")
    assert parent.wait_for_run("e2e_bundle", run, timeout=300) == "success", parent.task_log("e2e_bundle", run, "run")
    assert f"{expected}  data/weights.bin" in parent.task_log("e2e_bundle", run, "run")  # read on the peer
    job_id = job_of(parent, run, "e2e_bundle")
    bundle = federation.parent_store.get_job(job_id).job_spec.bundle
    assert bundle is not None and bundle.size > SIZE
    received = federation.peer_store.get_job(on_peer(job_id))
    assert received.job_spec.bundle == bundle and received.peer_id == "marin"
    peer_copy = federation.peer.home / "iris" / "bundles" / "sha256" / bundle.hex
    assert peer_copy.stat().st_size == bundle.size

    # The same workdir again: the same bundle, which the peer has: admitted at once, nothing uploaded.
    uploads = [
        path for path, _ in federation.proxy.served if path.startswith(f"/iris/federation/v1/bundles/{bundle.digest}")
    ]
    chunks = sum("offset=" in path for path in uploads)
    assert chunks == -(-bundle.size // (8 * MiB))  # the default chunk size, each once
    again = parent.trigger("e2e_bundle", {"job": job, "workdir": str(workdir)}, user="alice")
    assert parent.wait_for_run("e2e_bundle", again, timeout=300) == "success"
    assert federation.peer_store.get_job(on_peer(job_of(parent, again, "e2e_bundle"))).job_spec.bundle == bundle
    served = [
        path for path, _ in federation.proxy.served if path.startswith(f"/iris/federation/v1/bundles/{bundle.digest}")
    ]
    assert served == uploads  # not even asked about


def test_a_200_mib_upload_streams_through_the_peers_api_server(federation: Federation, tmp_path: Path) -> None:
    """Measured: the time to upload 200 MiB straight to the peer's api-server, and what its peak
    RSS grows by meanwhile (streamed to disk: nowhere near the bundle's size)."""
    data = tmp_path / "data.bin"
    write_random(data, SIZE)
    store = BundleStore(tmp_path / "bundles")
    size = data.stat().st_size

    def read():  # type: ignore[no-untyped-def]
        with data.open("rb") as handle:
            while block := handle.read(MiB):
                yield block

    ref = store.pack([BundleEntry("data.bin", size, False, read)])
    peer = AirflowPeer(
        "cw-east",
        federation.peer.base_url,
        TokenMinter("marin", federation.keys["marin"][0]),
        allow_insecure_http=True,
        bundles=store,
        delivery_timeout_seconds=120,
    )
    api_server = federation.peer.processes["api-server"].pid
    before = peak_rss_kib(api_server)
    started = time.monotonic()
    assert peer.upload_bundle(ref).complete
    seconds = time.monotonic() - started
    after = peak_rss_kib(api_server)
    print(
        f"\nuploaded {ref.size / MiB:.0f} MiB in {seconds:.2f} s ({ref.size / MiB / seconds:.0f} MiB/s); "
        f"api-server peak RSS {before / 1024:.0f} MiB before, {after / 1024:.0f} MiB after"
    )
    assert (federation.peer.home / "iris" / "bundles" / "sha256" / ref.hex).stat().st_size == ref.size
    assert after - before < 64 * 1024  # KiB: a few chunks at most, never the bundle

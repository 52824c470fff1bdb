"""The tick keeps the bundle store bounded: a finished job's workdir bundle goes once unused for
``bundles.keep_unused_seconds`` of the federation's clock; a live job's never does; what a dead
packer left goes like an abandoned upload. New uploads are admitted one at a time, each promised its
room, so that uploads admitted together never pass ``bundles.max_total_bytes``."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from iris_airflow_provider.backends.bundle_collection import StoreListing, list_store
from iris_airflow_provider.backends.bundles import BundleStore
from iris_airflow_provider.core.bundle_retention import RetentionRules
from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.operators.workdir import bundle_workdir
from iris_airflow_provider.services import bundle_retention
from iris_airflow_provider.services.bundle_retention import admit_upload
from tests.services.world import ALICE, World, tick_until

DAY_MS = 86_400_000


def packed(world: World, name: str) -> BundleRef:
    source = world.tmp_path / "workdirs" / name
    source.mkdir(parents=True)
    (source / "run.sh").write_text(f"echo {name} from its bundle\n")
    return bundle_workdir(source, world.config.bundle_store())


def submit(world: World, name: str, ref: BundleRef, command: str) -> str:
    job_id = f"/alice/{name}"
    spec = parse_job(
        {"job_id": job_id, "command": command, "resources": {"device": {"type": "cpu"}}, "bundle": ref.model_dump()}
    )
    world.federation().submit(spec, submitting_user=ALICE)
    return job_id


def test_a_finished_jobs_bundle_goes_after_keep_unused_and_a_live_jobs_never(world: World) -> None:
    federation = world.federation()
    bundles = world.config.bundle_store()
    done_ref, live_ref = packed(world, "done"), packed(world, "live")
    done = submit(world, "done", done_ref, "sh run.sh")
    live = submit(world, "live", live_ref, world.held("live", "sh run.sh"))
    tick_until(federation, world.store, done, JobState.SUCCEEDED)
    tick_until(federation, world.store, live, JobState.RUNNING)
    assert world.store.live_bundle_digests() == {live_ref.digest}

    # The bundles' last uses are real (wall-clock) times a little after the world's clock stopped:
    # moving the clock a minute past the day is more than enough.
    world.clock.advance(DAY_MS - 60_000)  # not yet unused for a day
    assert federation.tick().collected == []
    assert bundles.peek(done_ref) and bundles.peek(live_ref)

    world.clock.advance(120_000)
    report = federation.tick()
    assert report.collected == [done_ref.digest]
    assert "collected 1: " + done_ref.digest in report.summary()
    assert not bundles.peek(done_ref) and bundles.peek(live_ref)

    world.clock.advance(3 * DAY_MS)  # however long it runs (short of the 30-day job retention)
    assert federation.tick().collected == []
    assert bundles.peek(live_ref)
    world.release("live")
    tick_until(federation, world.store, live, JobState.SUCCEEDED)
    assert world.store.live_bundle_digests() == set()
    assert bundles.peek(live_ref)  # in use until its job ended: its day unused starts now
    world.clock.advance(DAY_MS + 60_000)
    assert federation.tick().collected == [live_ref.digest]
    assert list((bundles.directory / "sha256").iterdir()) == []


def test_an_abandoned_upload_goes_after_keep_partial(world: World) -> None:
    federation = world.federation()
    bundles = world.config.bundle_store()
    ref = BundleRef(digest="sha256:" + "ab" * 32, size=1000)
    with bundles.upload(ref, 0, 100) as chunk:
        chunk.write(b"x" * 100)
    world.clock.advance(3_600_000 - 60_000)
    assert federation.tick().collected == []
    world.clock.advance(120_000)
    assert federation.tick().collected == [f"partial {ref.digest}"]
    assert bundles.received(ref) == 0


def test_a_file_a_dead_packer_left_goes_after_keep_partial(world: World) -> None:
    federation = world.federation()
    bundles = world.config.bundle_store()
    bundles.complete_dir.mkdir(parents=True, exist_ok=True)
    left = bundles.complete_dir / ".packing-k1lled"
    left.write_bytes(b"half a bundle")
    world.clock.advance(3_600_000 - 60_000)
    assert federation.tick().collected == []
    world.clock.advance(120_000)
    assert federation.tick().collected == ["stray .packing-k1lled"]
    assert not left.exists()


class NoLiveJobs:
    def live_bundle_digests(self) -> set[str]:
        return set()


def test_uploads_admitted_at_once_are_promised_no_more_room_than_the_store_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight api-server threads admit a new 300-byte upload each at the same moment, into a store with
    room for 900 bytes beside a bundle it holds: three fit, and three are admitted. Each thread, once
    it has listed the store, waits (a second at most) for the others to list it too: were admissions
    not one at a time, all eight would judge the same empty store and be admitted."""
    listed = threading.Barrier(8, timeout=1)

    def list_then_wait(store: BundleStore) -> StoreListing:
        listing = list_store(store)
        with contextlib.suppress(threading.BrokenBarrierError):
            listed.wait()  # one at a time, nobody else can list meanwhile: the barrier breaks
        return listing

    monkeypatch.setattr(bundle_retention, "list_store", list_then_wait)
    bundles = BundleStore(tmp_path / "bundles")
    held = bundles.pack([])  # an empty archive: some bytes, used just now
    rules = RetentionRules(max_total_bytes=held.size + 900)
    refs = [BundleRef(digest="sha256:" + f"{n:064x}", size=300) for n in range(8)]
    start = threading.Barrier(len(refs))
    answers: dict[str, str] = {}

    def admit(ref: BundleRef) -> None:
        start.wait()
        answers[ref.digest] = admit_upload(NoLiveJobs(), bundles, ref, rules, now_ms=0)

    threads = [threading.Thread(target=admit, args=(ref,)) for ref in refs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = [ref for ref in refs if answers[ref.digest] == ""]
    assert len(admitted) == 3
    assert all("still to come" in answers[ref.digest] for ref in refs if ref not in admitted)
    assert {ref.digest for ref in refs if bundles.is_uploading(ref)} == {ref.digest for ref in admitted}
    # Asking again for an admitted upload does not promise its room twice.
    assert admit_upload(NoLiveJobs(), bundles, admitted[0], rules, now_ms=0) == ""
    assert len(os.listdir(bundles.partial_dir)) == 3 + 1  # and the admission lock

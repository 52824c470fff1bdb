"""The tick keeps the bundle store bounded: a finished job's workdir bundle goes once unused for
``bundles.keep_unused_seconds`` of the federation's clock; a live job's never does."""

from __future__ import annotations

from iris_airflow_provider.core.bundles import BundleRef
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.operators.workdir import bundle_workdir
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

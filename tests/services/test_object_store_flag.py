"""A job bound for a peer that cannot read the object-store paths it names is flagged before the
handoff: in its history and in the task log of whoever waits for it (DESIGN.md, beyond the reference)."""

from __future__ import annotations

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.states import JobState
from iris_airflow_provider.services.job_views import job_explanation
from tests.services.world import ALICE, World, event_kinds, tick_until

S3_ONLY = {"object-store": ["s3"]}


def gpu_job(job_id: str, pin: str = "", count: int = 1, **env: str):
    return parse_job(
        {
            "job_id": job_id,
            "command": "echo trained",
            "env": env,
            "target_cluster": pin,
            "resources": {"device": {"type": "gpu", "variant": "h200", "count": count}},
        }
    )


def test_a_gs_path_bound_for_an_s3_only_peer_is_flagged_before_the_handoff(world: World) -> None:
    world.add_peer("cw-east", S3_ONLY, h200=4)
    federation = world.federation()
    federation.submit(gpu_job("/alice/gs", MARIN_PREFIX="gs://marin-us-central2/run-1"), submitting_user=ALICE)
    federation.submit(gpu_job("/alice/s3", MARIN_PREFIX="s3://cw-bucket/run-1"), submitting_user=ALICE)
    report = federation.tick()
    assert sorted(report.delivered) == ["/alice/gs", "/alice/s3"]  # a warning, not a refusal

    kinds = event_kinds(world.store, "/alice/gs")
    assert kinds.index("object_store_mismatch") < kinds.index("handed_off")
    [flag] = [e for e in world.store.events("/alice/gs") if e.kind == "object_store_mismatch"]
    assert flag.peer_id == "cw-east"
    assert flag.detail == (
        "Job /alice/gs names object-store paths that peer cw-east (backend default) cannot read "
        "(env MARIN_PREFIX=gs://marin-us-central2/run-1); it reads only s3://. Credentials do not travel with "
        "a handoff: move the data into that store or pin the job elsewhere."
    )
    # The waiting task relays this line into its log, before any of the job's own output.
    assert world.store.log_lines("/alice/gs")[0][1] == f"[iris-federation] Warning: {flag.detail}"
    assert "object_store_mismatch" not in event_kinds(world.store, "/alice/s3")
    done = tick_until(federation, world.store, "/alice/gs", JobState.SUCCEEDED)
    assert [line for _, line in world.store.log_lines("/alice/gs")][-1].endswith("trained")
    assert (done.peer_id, done.exit_code) == ("cw-east", 0)


def test_explain_shows_which_backends_cannot_read_a_queued_jobs_paths(world: World) -> None:
    world.add_peer("cw-east", S3_ONLY, h200=8)
    federation = world.federation()
    federation.submit(gpu_job("/alice/big", count=8, MARIN_PREFIX="gs://marin/x"), submitting_user=ALICE)
    job = world.job("/alice/big")
    explained = job_explanation(federation, job, world.clock())
    rows = {
        (peer["peer_id"], row["backend_id"]): row
        for peer in explained["explanation"]["peers"]
        for row in peer["backends"]
    }
    assert rows[("cw-east", "default")]["unreadable_paths"] == ["env MARIN_PREFIX=gs://marin/x"]
    assert all("unreadable_paths" not in row for key, row in rows.items() if key[0] != "cw-east")

"""Which object-store paths of a job a backend cannot read, and how that is said."""

from __future__ import annotations

from iris_airflow_provider.core.constraints import normalize_advertised
from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.object_stores import (
    ForeignPath,
    mismatch_message,
    object_store_paths,
    unreadable_paths,
)

S3_ONLY = normalize_advertised({"device-type": ["gpu"], "object-store": ["S3"]})


def job(command: str = "true", **env: str):
    return parse_job({"job_id": "/alice/train", "command": command, "env": env})


def test_paths_are_found_in_the_environment_and_the_command_with_canonical_schemes() -> None:
    spec = job("python train.py --data gcs://marin-data/x --out s3a://cw/out", MARIN_PREFIX="gs://marin-us/p")
    assert object_store_paths(spec) == [
        ForeignPath("env MARIN_PREFIX", "gs://marin-us/p", "gs"),
        ForeignPath("command", "gcs://marin-data/x", "gs"),
        ForeignPath("command", "s3a://cw/out", "s3"),
    ]


def test_urls_that_are_not_object_stores_are_ignored() -> None:
    spec = job("curl https://example.com/x && git clone ssh://git@host/repo", HF_HOME="file:///tmp/hf")
    assert object_store_paths(spec) == []


def test_a_backend_that_reads_only_s3_cannot_read_gs_paths() -> None:
    spec = job("python train.py", MARIN_PREFIX="gs://marin-us-central2/runs", OUT="s3://cw-bucket/out")
    assert unreadable_paths(spec, S3_ONLY) == [ForeignPath("env MARIN_PREFIX", "gs://marin-us-central2/runs", "gs")]
    assert unreadable_paths(spec, normalize_advertised({"object-store": ["gs", "s3"]})) == []


def test_a_backend_that_does_not_say_what_it_reads_is_not_judged() -> None:
    spec = job(MARIN_PREFIX="gs://marin-us-central2/runs")
    assert unreadable_paths(spec, normalize_advertised({"device-type": ["gpu"]})) == []


def test_the_message_names_the_paths_the_target_and_what_it_reads() -> None:
    paths = [ForeignPath(f"env P{i}", f"gs://bucket/{'x' * (90 if i == 0 else 1)}", "gs") for i in range(4)]
    message = mismatch_message("/alice/train", "peer cw-east (backend default)", paths, ["s3"])
    assert message.startswith(
        "Job /alice/train names object-store paths that peer cw-east (backend default) cannot read (env P0=gs://bucket/"
    )
    assert "...), it reads" not in message and "env P2=gs://bucket/x ...); it reads only s3://." in message
    assert "env P3" not in message  # at most three shown
    assert "Credentials do not travel with a handoff" in message

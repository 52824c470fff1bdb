"""A queued job's explanation replays the placement pass on the same snapshot the tick places from."""

from __future__ import annotations

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place
from iris_airflow_provider.core.waiting import explain_waiting
from tests.core.builders import NOW, gpu, peer

RULES = PlacementRules(max_per_peer=8, staleness_ms=120_000)


def spec(job_id: str, count: int, **env: str):
    device = {"type": "gpu", "variant": "h100", "count": count}
    return parse_job({"job_id": job_id, "resources": {"device": device}, "env": env})


def snapshot(*specs, peers=None, now=NOW) -> PlacementSnapshot:
    candidates = tuple(Candidate.from_job(s, index) for index, s in enumerate(specs))
    return PlacementSnapshot(candidates, tuple(peers or (peer("cw", gpu("default", "h100", 8)),)), (), now)


def test_place_runs_the_pass_over_the_snapshot() -> None:
    result = place(snapshot(spec("/alice/a", 8)), RULES)
    assert [(p.job_id, p.peer_id, p.backend_id) for p in result.promotions] == [("/alice/a", "cw", "default")]


def test_a_job_that_fits_now_is_placeable_on_the_next_tick() -> None:
    explained = explain_waiting(spec("/alice/a", 8), snapshot(spec("/alice/a", 8)), RULES)
    assert explained["status"] == "placeable"
    assert explained["summary"] == "It fits now on cw/default: the next placement tick promotes it."
    assert (explained["explanation"]["jobs_ahead"], explained["explanation"]["queued_jobs"]) == (0, 1)


def test_a_job_behind_another_waits_and_says_how_many_are_ahead() -> None:
    first, second = spec("/alice/a", 8), spec("/alice/b", 8)
    explained = explain_waiting(second, snapshot(first, second), RULES)
    assert explained["status"] == "waiting"
    assert explained["explanation"]["jobs_ahead"] == 1
    assert explained["summary"].startswith("Needs 8 h100 on one backend; the most any matching backend offers is 0")


def test_a_job_past_its_deadline_is_expiring() -> None:
    late = parse_job(
        {
            "job_id": "/alice/late",
            "resources": {"device": {"type": "gpu", "variant": "h100", "count": 8}},
            "scheduling_deadline_ms": NOW - 1,
        }
    )
    assert explain_waiting(late, snapshot(late), RULES)["status"] == "expiring"


def test_a_job_no_longer_queued_in_the_snapshot_has_changed() -> None:
    assert explain_waiting(spec("/alice/gone", 8), snapshot(spec("/alice/a", 8)), RULES) == {
        "status": "changed",
        "summary": "It changed while being explained; reload.",
    }

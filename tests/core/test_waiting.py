"""A queued job's explanation replays the placement pass on the same snapshot the tick places from."""

from __future__ import annotations

from iris_airflow_provider.core.model import parse_job
from iris_airflow_provider.core.placement import Candidate
from iris_airflow_provider.core.placement_snapshot import PlacementRules, PlacementSnapshot, place
from iris_airflow_provider.core.reservations import RESERVED_NOTE, InFlight
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


def h100_peer(peer_id: str, free: int, total: int | None, **kwargs):
    return peer(peer_id, gpu("default", "h100", free, total=None if total is None else {"h100": total}), **kwargs)


class TestWhatItWaitsFor:
    HOLDING = PlacementRules(max_per_peer=8, staleness_ms=120_000, reserve_after_ms=1_800_000)
    OLD = NOW - 41 * 60_000

    def test_a_job_no_reachable_backend_can_ever_hold_says_so_plainly(self) -> None:
        big = spec("/alice/big", 16)
        explained = explain_waiting(big, snapshot(big, peers=[h100_peer("cw-h100", 8, 8)]), RULES)
        assert explained["status"] == "never_fits"
        assert explained["explanation"]["never_fits"] is True
        assert explained["summary"] == (
            "No reachable backend can ever hold it: Job /alice/big needs 16 h100 on one backend; the largest that "
            "can host it is cw-h100/default with 8 in total. It stays queued in case a larger backend reports; "
            "cancel it or ask for less."
        )

    def test_the_held_job_says_what_it_holds_and_what_it_waits_for(self) -> None:
        big, small = spec("/alice/big", 32), spec("/bob/small", 8)
        candidates = (Candidate.from_job(big, self.OLD), Candidate.from_job(small, self.OLD + 1))
        state = PlacementSnapshot(candidates, (h100_peer("cw-h100", 8, 32),), (), NOW)
        explained = explain_waiting(big, state, self.HOLDING)
        assert explained["status"] == "holding"
        assert explained["summary"] == (
            "It has waited 41 min, so it holds cw-h100/default, where it would fit soonest: 8 of its 32 h100 are "
            "available there now (free + reclaimable from lower bands). No job behind it in the queue is placed "
            "there, and it is placed when 24 more h100 free up there."
        )
        assert explained["explanation"]["holding"]["text"] == "holding cw-h100/default for /alice/big (waiting 41 min)"

    def test_a_job_kept_off_a_held_backend_names_the_hold(self) -> None:
        big, small = spec("/alice/big", 32), spec("/bob/small", 8)
        candidates = (Candidate.from_job(big, self.OLD), Candidate.from_job(small, self.OLD + 1))
        state = PlacementSnapshot(candidates, (h100_peer("cw-h100", 8, 32),), (), NOW)
        explained = explain_waiting(small, state, self.HOLDING)
        assert explained["status"] == "waiting"
        assert explained["summary"] == (
            "It would fit on cw-h100/default, but that backend is holding cw-h100/default for /alice/big (waiting "
            "41 min): no job behind that one in the queue is placed there until it is."
        )
        [row] = explained["explanation"]["peers"][0]["backends"]
        assert (row["held_for"], row["hold"]) == (
            "/alice/big",
            "holding cw-h100/default for /alice/big (waiting 41 min)",
        )

    def test_capacity_reserved_for_jobs_handed_off_is_shown_and_counted(self) -> None:
        waiting = spec("/alice/next", 8)
        in_flight = (InFlight("/alice/first", "cw", "default", {"h100": 8}),)
        state = PlacementSnapshot((Candidate.from_job(waiting, 0),), (h100_peer("cw", 8, 16),), (), NOW, in_flight)
        explained = explain_waiting(waiting, state, RULES)
        assert explained["status"] == "waiting"
        [row] = explained["explanation"]["peers"][0]["backends"]
        assert (row["reserved"], row["reserved_note"]) == ({"h100": 8}, RESERVED_NOTE)
        assert row["free"] == {"h100": 0}
        assert explained["summary"] == (
            "Needs 8 h100 on one backend; the most any matching backend offers is 0 (0 free + 0 reclaimable from "
            "lower bands, after 8 h100 reserved for jobs handed off and not yet running there) on cw/default. "
            "It is placed when 8 more free up there or a peer reports more."
        )

"""`iris-federation simulate`: one JSON state in, one JSON document of decisions out."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.cli import main
from iris_airflow_provider.core import reasons
from iris_airflow_provider.core.errors import SpecError
from iris_airflow_provider.core.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = 1_000_000
EPOCH = 990_000
H100_ATTRIBUTES = {"device-type": ["gpu"], "device-variant": ["h100"]}


def load(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


def gpu_backend(
    backend_id: str, variant: str, free: int | None = None, *, epoch: int = EPOCH, held: list[Any] | None = None
) -> dict[str, Any]:
    block: dict[str, Any] = {"backend_id": backend_id, "advertised_attributes": {"device-type": ["gpu"]}}
    block["advertised_attributes"]["device-variant"] = [variant]
    if free is not None:
        block["availability"] = {
            "version": 2,
            "observation_epoch_ms": epoch,
            "amounts": {variant: free},
            "held_by_band": held or [],
        }
    return block


def peer(peer_id: str, *backends: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"peer_id": peer_id, "last_contact_ms": NOW - 5_000, "backends": list(backends), **fields}


def gpu_job(job_id: str, variant: str = "h100", count: int = 8, submitted: int = 0, **fields: Any) -> dict[str, Any]:
    device = {"type": "gpu", "variant": variant, "count": count}
    return {"job_id": job_id, "submitted_at_ms": submitted, "resources": {"device": device}, **fields}


def cpu_job(job_id: str, submitted: int = 0, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "submitted_at_ms": submitted, **fields}


def state(*peers: dict[str, Any], jobs: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"now_ms": NOW, "peers": list(peers), "jobs": jobs, **fields}


def placed(output: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {p["job_id"]: (p["peer_id"], p["backend_id"]) for p in output["promotions"]}


def dispositions(output: dict[str, Any]) -> dict[str, str]:
    return {d["job_id"]: d["disposition"] for d in output["decisions"]}


def run_cli(argv: list[str], stdin_text: str = "") -> tuple[int, str]:
    stdout = io.StringIO()
    code = main(argv, stdin=io.StringIO(stdin_text), stdout=stdout)
    return code, stdout.getvalue()


class TestExamples:
    def test_the_seed_job_is_rejected_because_the_only_peer_advertises_no_region(self):
        output = simulate(load("simulate-seed.json"))
        (decision,) = output["decisions"]
        assert decision["job_id"] == "/alice/train"
        assert decision["disposition"] == "reject"
        assert decision["pinned_peer_id"] == ""
        assert (
            "Peer cw-rno2a backend default: needs region EQ us-east, advertises region=nothing." in (decision["reason"])
        )
        assert (output["promotions"], output["pending"], output["expired"]) == ([], [], [])
        # The row is at the backend's current observation, so it still applies.
        assert output["ledger"] == [
            {"peer_id": "cw-rno2a", "backend_id": "default", "observation_epoch_ms": 990000, "reserved": {"h100": 8}}
        ]

    def test_the_seed_job_queues_once_it_drops_the_region(self):
        document = load("simulate-seed.json")
        document["jobs"][0]["constraints"] = []
        output = simulate(document)
        assert dispositions(output) == {"/alice/train": "queue"}
        # 8 free are already reserved; the interactive job reclaims 8 of the 360 batch holds.
        (promotion,) = output["promotions"]
        assert (promotion["peer_id"], promotion["backend_id"], promotion["preempts"]) == ("cw-rno2a", "default", True)
        assert output["ledger"][0]["reserved"] == {"h100": 16}

    def test_contention(self):
        output = simulate(load("simulate-contention.json"))
        assert set(dispositions(output).values()) == {"queue"}
        assert output["decisions"][1]["pinned_peer_id"] == "cw-us-east-08a"
        assert [
            (p["job_id"], p["peer_id"], p["backend_id"], p["preempts"], p["reserved"], p["observation_epoch_ms"])
            for p in output["promotions"]
        ] == [
            # Interactive work reclaims batch holds on the full peer.
            ("/alice/chat", "cw-rno2a", "default", True, {"h100": 8}, EPOCH),
            # Pinned: the GB200 peer hosts the small job; the large one waits for it.
            ("/carol/gb200-small", "cw-us-east-08a", "gb200", False, {"gb200": 8}, EPOCH),
            # Only a shape-only backend advertises a100: no capacity check, nothing reserved.
            ("/erin/finetune", "cw-us-east-02a", "a100", False, {}, None),
            # Ungated CPU jobs spread over the peers instead of piling onto the first.
            ("/dave/etl-0", "cw-rno2a", "default", False, {}, EPOCH),
            ("/dave/etl-1", "cw-us-east-02a", "h100", False, {}, EPOCH),
            ("/dave/etl-2", "cw-us-east-08a", "gb200", False, {}, EPOCH),
            ("/dave/etl-3", "cw-rno2a", "default", False, {}, EPOCH),
        ]
        assert [(p["job_id"], p["reason"]) for p in output["pending"]] == [
            ("/carol/gb200-large", "Queued for peer cw-us-east-08a to report free capacity"),
            # Batch reclaims nothing on cw-rno2a, and the ledger has used up cw-us-east-02a/h100.
            ("/bob/sweep", "Queued for a federation peer to report free capacity"),
        ]
        assert output["expired"] == ["/frank/late"]
        # The older cw-rno2a row and the removed peer's row are gone.
        assert output["ledger"] == [
            {"peer_id": "cw-rno2a", "backend_id": "default", "observation_epoch_ms": EPOCH, "reserved": {"h100": 8}},
            {
                "peer_id": "cw-us-east-02a",
                "backend_id": "h100",
                "observation_epoch_ms": EPOCH,
                "reserved": {"h100": 16},
            },
            {
                "peer_id": "cw-us-east-08a",
                "backend_id": "gb200",
                "observation_epoch_ms": EPOCH,
                "reserved": {"gb200": 8},
            },
        ]

    def test_contention_without_the_ledger_the_batch_sweep_fits(self):
        document = load("simulate-contention.json")
        document["ledger"] = []
        assert placed(simulate(document))["/bob/sweep"] == ("cw-us-east-02a", "h100")

    def test_contention_if_the_old_row_still_applied_the_chat_job_would_wait(self):
        # Replayed at the current observation, 400 reserved eat the batch holds the chat job reclaims.
        document = load("simulate-contention.json")
        document["ledger"][1]["observation_epoch_ms"] = EPOCH
        output = simulate(document)
        assert "/alice/chat" in {p["job_id"] for p in output["pending"]}

    def test_routing(self):
        output = simulate(load("simulate-routing.json"))
        assert dispositions(output) == {
            "/alice/tpu-train": "local",
            "/alice/tpu-pinned": "queue",
            "/alice/typo": "reject",
            "/alice/coordinator/train": "reject",
            "/bob/h100-east": "reject",
            "/bob/h100-any-region": "queue",
            "/bob/gb200": "reject",
            "/bob/a100": "reject",
            "/carol/a10": "queue",
            "/carol/cpu": "local",
        }
        reasons_by_job = {d["job_id"]: d["reason"] for d in output["decisions"]}
        assert "pins cluster 'cw-rn02a', which is not a configured federation peer" in reasons_by_job["/alice/typo"]
        assert "Set target_cluster on the root job /alice/coordinator" in reasons_by_job["/alice/coordinator/train"]
        assert "needs region EQ us-east, advertises region=nothing" in reasons_by_job["/bob/h100-east"]
        assert "Peer cw-us-east-08a: last heartbeat 100s ago, past the 60s bound." in reasons_by_job["/bob/gb200"]
        assert "Peer cw-down: unreachable." in reasons_by_job["/bob/a100"]
        assert [(p["job_id"], p["peer_id"], p["backend_id"], p["reserved"]) for p in output["promotions"]] == [
            # Pinned and advertising no TPU backend: force-routed to the peer itself.
            ("/alice/tpu-pinned", "cw-rno2a", "", {}),
            # Counts arrive as proto3 JSON strings; two replicas of 8 gate on 16.
            ("/bob/h100-any-region", "cw-rno2a", "default", {"h100": 16}),
            # A version-3 block is not understood: shape only, whatever fields it carries.
            ("/carol/a10", "lambda", "a10", {}),
        ]
        assert output["promotions"][2]["observation_epoch_ms"] is None
        assert output["pending"] == output["expired"] == []


class TestOutput:
    def test_the_document_has_exactly_the_six_keys(self):
        assert list(simulate({"now_ms": NOW})) == [
            "decisions",
            "promotions",
            "pending",
            "expired",
            "ledger",
            "reservations",
        ]

    def test_decisions_follow_input_order_and_carry_four_fields(self):
        jobs = [cpu_job("/z/last", submitted=9), cpu_job("/a/first", submitted=1, priority_band="production")]
        output = simulate(state(peer("p"), jobs=jobs))
        assert output["decisions"] == [
            {"job_id": "/z/last", "disposition": "queue", "pinned_peer_id": "", "reason": ""},
            {"job_id": "/a/first", "disposition": "queue", "pinned_peer_id": "", "reason": ""},
        ]

    def test_promotions_come_in_the_order_made(self):
        jobs = [cpu_job("/u/batch", priority_band="batch"), cpu_job("/u/late", submitted=5), cpu_job("/u/early")]
        output = simulate(state(peer("p"), jobs=jobs))
        assert [p["job_id"] for p in output["promotions"]] == ["/u/early", "/u/late", "/u/batch"]

    def test_pending_reasons_are_the_exact_runbook_strings(self):
        jobs = [gpu_job("/u/free"), gpu_job("/u/pinned", target_cluster="cw")]
        output = simulate(state(peer("cw", gpu_backend("default", "h100", 0)), jobs=jobs))
        assert [(p["job_id"], p["reason"]) for p in output["pending"]] == [
            ("/u/free", "Queued for a federation peer to report free capacity"),
            ("/u/pinned", "Queued for peer cw to report free capacity"),
        ]
        assert output["pending"][0]["reason"] == reasons.QUEUED_UNPINNED

    def test_every_pending_job_explains_itself(self):
        output = simulate(state(peer("cw", gpu_backend("default", "h100", 3)), jobs=[gpu_job("/u/big")]))
        explanation = output["pending"][0]["explanation"]
        assert explanation["gate"] == {"h100": 8}
        assert explanation["band"] == "PRIORITY_BAND_INTERACTIVE"
        assert explanation["peers"][0]["backends"][0] == {
            "backend_id": "default",
            "shape_matches": True,
            "unmet": [],
            "free": {"h100": 3},
            "reclaimable": {"h100": 0},
            "fits": False,
        }
        assert "Needs 8 h100 on one backend" in explanation["summary"]
        assert "5 more free up there" in explanation["summary"]

    def test_a_job_held_back_by_the_per_tick_cap_says_so(self):
        jobs = [gpu_job("/u/first"), gpu_job("/u/second", submitted=1)]
        output = simulate(state(peer("cw", gpu_backend("d", "h100", 64)), jobs=jobs, max_handoffs_per_cycle=1))
        (entry,) = output["pending"]
        assert entry["job_id"] == "/u/second"
        assert entry["explanation"]["peers"][0]["status"] == "reached 1 promotions this tick"
        assert entry["explanation"]["peers"][0]["backends"][0]["fits"] is True
        assert entry["explanation"]["summary"].startswith("Every usable peer reached its promotions for this tick")

    def test_a_job_pinned_to_a_stale_peer_says_it_waits_for_a_heartbeat(self):
        stale = peer("cw", gpu_backend("d", "h100", 8), last_contact_ms=NOW - 300_000)
        output = simulate(state(stale, peer("other"), jobs=[gpu_job("/u/a", target_cluster="cw")]))
        explanation = output["pending"][0]["explanation"]
        assert [row["peer_id"] for row in explanation["peers"]] == ["cw"]  # only the pinned peer
        assert explanation["peers"][0]["status"] == "stale: last heartbeat 300s ago"
        assert "reachable with a fresh heartbeat" in explanation["summary"]

    def test_without_explanations(self):
        output = simulate(
            state(peer("cw", gpu_backend("d", "h100", 0)), jobs=[gpu_job("/u/a")]), include_explanations=False
        )
        assert output["pending"] == [{"job_id": "/u/a", "reason": reasons.QUEUED_UNPINNED}]

    def test_local_and_rejected_jobs_are_not_placed(self):
        document = state(
            peer("cw", gpu_backend("default", "h100", 64)),
            jobs=[gpu_job("/u/local"), gpu_job("/u/nowhere", variant="gb200")],
            local_backends=[{"backend_id": "gpu", "advertised_attributes": H100_ATTRIBUTES}],
        )
        output = simulate(document)
        assert dispositions(output) == {"/u/local": "local", "/u/nowhere": "reject"}
        assert output["promotions"] == output["pending"] == output["expired"] == []


class TestExpiry:
    def test_a_queued_job_past_its_deadline_expires_and_is_neither_pending_nor_promoted(self):
        jobs = [
            gpu_job("/u/late", scheduling_deadline_ms=NOW - 1),
            gpu_job("/u/just-in-time", scheduling_deadline_ms=NOW),
            gpu_job("/u/late-waiting", count=64, scheduling_deadline_ms=0),
        ]
        output = simulate(state(peer("cw", gpu_backend("default", "h100", 16)), jobs=jobs))
        assert sorted(output["expired"]) == ["/u/late", "/u/late-waiting"]
        assert placed(output) == {"/u/just-in-time": ("cw", "default")}
        assert output["pending"] == []
        # The expired job reserved nothing.
        assert output["ledger"][0]["reserved"] == {"h100": 8}

    def test_only_queued_jobs_expire(self):
        document = state(
            peer("cw", gpu_backend("default", "h100", 16)),
            jobs=[gpu_job("/u/local", scheduling_deadline_ms=0)],
            local_backends=[{"backend_id": "gpu", "advertised_attributes": H100_ATTRIBUTES}],
        )
        output = simulate(document)
        assert dispositions(output) == {"/u/local": "local"}
        assert output["expired"] == []


class TestDefaults:
    def test_at_most_eight_promotions_per_peer_by_default(self):
        jobs = [cpu_job(f"/u/{i}", submitted=i) for i in range(9)]
        output = simulate(state(peer("only"), jobs=jobs))
        assert len(output["promotions"]) == 8
        assert [p["job_id"] for p in output["pending"]] == ["/u/8"]

    def test_the_cap_is_configurable(self):
        jobs = [cpu_job(f"/u/{i}", submitted=i) for i in range(3)]
        output = simulate(state(peer("only"), jobs=jobs, max_handoffs_per_cycle=1))
        assert [p["job_id"] for p in output["promotions"]] == ["/u/0"]

    @pytest.mark.parametrize(("age", "disposition"), [(120_000, "queue"), (120_001, "reject")])
    def test_heartbeats_go_stale_after_two_minutes_by_default(self, age, disposition):
        document = state(peer("cw", gpu_backend("d", "h100", 8), last_contact_ms=NOW - age), jobs=[gpu_job("/u/a")])
        assert dispositions(simulate(document)) == {"/u/a": disposition}

    def test_a_stale_pin_waits_for_its_peer(self):
        stale = peer("cw", gpu_backend("d", "h100", 8), last_contact_ms=NOW - 10_000)
        output = simulate(state(stale, jobs=[gpu_job("/u/a", target_cluster="cw")], heartbeat_staleness_ms=1_000))
        assert output["promotions"] == []
        assert output["pending"][0]["reason"] == "Queued for peer cw to report free capacity"

    def test_ledger_and_local_backends_default_to_empty(self):
        output = simulate(state(peer("cw", gpu_backend("d", "h100", 8)), jobs=[gpu_job("/u/a")]))
        assert placed(output) == {"/u/a": ("cw", "d")}
        assert output["ledger"] == [
            {"peer_id": "cw", "backend_id": "d", "observation_epoch_ms": EPOCH, "reserved": {"h100": 8}}
        ]


class TestLedger:
    PEERS = (
        peer("a", gpu_backend("one", "h100", 8), gpu_backend("two", "h100", 8, epoch=EPOCH + 10)),
        peer("b", gpu_backend("one", "h100", 8)),
    )

    def row(self, peer_id: str, backend_id: str, epoch: int, **reserved: int) -> dict[str, Any]:
        return {"peer_id": peer_id, "backend_id": backend_id, "observation_epoch_ms": epoch, "reserved": reserved}

    def test_rows_apply_at_or_after_the_current_observation_and_drop_before_it(self):
        ledger = [
            self.row("a", "one", EPOCH, h100=3),  # same observation: applies
            self.row("a", "one", EPOCH + 5, h100=1),  # newer than the backend's: applies
            self.row("a", "two", EPOCH, h100=8),  # the backend reports a strictly newer observation: dropped
            self.row("b", "gone", EPOCH, h100=8),  # backend absent: dropped
            self.row("c", "one", EPOCH, h100=8),  # peer absent: dropped
        ]
        output = simulate(state(*self.PEERS, jobs=[], ledger=ledger))
        assert output["ledger"] == [self.row("a", "one", EPOCH + 5, h100=4)]

    def test_applicable_rows_are_spent_before_placing(self):
        ledger = [self.row("a", "two", EPOCH + 10, h100=8), self.row("b", "one", EPOCH, h100=8)]
        jobs = [gpu_job("/u/big", count=6), gpu_job("/u/small", count=2, submitted=1)]
        output = simulate(state(*self.PEERS, jobs=jobs, ledger=ledger))
        assert placed(output) == {"/u/big": ("a", "one"), "/u/small": ("a", "one")}

    def test_output_is_sorted_merged_and_without_zero_amounts(self):
        ledger = [
            self.row("b", "one", EPOCH, h100=2, a100=0),
            self.row("a", "two", EPOCH + 10, h100=0),
            self.row("a", "one", EPOCH, H100=1),
        ]
        output = simulate(state(*self.PEERS, jobs=[gpu_job("/u/x", count=3)], ledger=ledger))
        assert output["ledger"] == [
            self.row("a", "one", EPOCH, h100=1),
            self.row("b", "one", EPOCH, h100=2 + 3),  # best fit: b/one had the least to spare
        ]

    def test_rows_for_unreachable_peers_are_kept(self):
        down = peer("a", gpu_backend("one", "h100", 8), reachable=False)
        output = simulate(state(down, jobs=[], ledger=[self.row("a", "one", EPOCH, h100=2)]))
        assert output["ledger"] == [self.row("a", "one", EPOCH, h100=2)]


class TestAvailabilityBlocks:
    def test_a_backend_without_availability_is_matched_on_shape_alone(self):
        huge = gpu_job("/u/a", count=8)
        huge["resources"]["replicas"] = 512
        output = simulate(state(peer("cw", gpu_backend("d", "h100")), jobs=[huge]))
        assert output["promotions"] == [
            {
                "job_id": "/u/a",
                "peer_id": "cw",
                "backend_id": "d",
                "preempts": False,
                "reserved": {},
                "observation_epoch_ms": None,
            }
        ]
        assert output["ledger"] == []

    @pytest.mark.parametrize("version", [3, "3", 99])
    def test_a_newer_block_version_is_treated_as_shape_only(self, version):
        backend = gpu_backend("d", "h100", 0)
        backend["availability"] |= {"version": version, "per_node": [{"h100": 1}]}  # fields we do not know
        output = simulate(state(peer("cw", backend), jobs=[gpu_job("/u/a")]))
        assert placed(output) == {"/u/a": ("cw", "d")}
        assert output["promotions"][0]["observation_epoch_ms"] is None

    def test_a_known_version_with_an_unknown_field_is_an_error(self):
        backend = gpu_backend("d", "h100", 0)
        backend["availability"]["per_node"] = []
        with pytest.raises(SpecError, match=r"peers\[0\]\.backends\[0\]\.availability: unknown field\(s\) per_node"):
            simulate(state(peer("cw", backend), jobs=[]))

    def test_held_by_band_unspecified_is_ignored(self):
        unspecified = [{"band": "PRIORITY_BAND_UNSPECIFIED", "amounts": {"h100": 8}}]
        batch = [{"band": "PRIORITY_BAND_BATCH", "amounts": {"h100": 8}}]
        for held, expected in ((unspecified, []), (batch, ["/u/a"])):
            document = state(peer("cw", gpu_backend("d", "h100", 0, held=held)), jobs=[gpu_job("/u/a")])
            assert list(placed(simulate(document))) == expected

    def test_amount_tokens_are_lowercased_everywhere(self):
        backend = gpu_backend("d", "H100", 0, held=[{"band": "batch", "amounts": {"H100": 16}}])
        backend["availability"]["amounts"] = {"H100": 8}
        ledger = [{"peer_id": "cw", "backend_id": "d", "observation_epoch_ms": EPOCH, "reserved": {"H100": 4}}]
        output = simulate(state(peer("cw", backend), jobs=[gpu_job("/u/a", variant="H100", count=12)], ledger=ledger))
        assert output["promotions"][0]["reserved"] == {"h100": 12}
        assert output["promotions"][0]["preempts"]
        assert output["ledger"][0]["reserved"] == {"h100": 16}


class TestInvalidInput:
    @pytest.mark.parametrize(
        ("document", "expected"),
        [
            (
                {"now_ms": NOW, "peers": [peer("a"), peer("b"), peer("a")]},
                "peers: peer_id must be unique; repeated: a",
            ),
            (
                {"now_ms": NOW, "jobs": [cpu_job("/u/x"), cpu_job("/u/x")]},
                "jobs: job_id must be unique; repeated: /u/x",
            ),
            (
                {"now_ms": NOW, "peers": [peer("a", gpu_backend("d", "h100"), gpu_backend("d", "a100"))]},
                "peers[0].backends: backend_id must be unique; repeated: d",
            ),
            (
                {"now_ms": NOW, "local_backends": [{"backend_id": "x"}, {"backend_id": "x"}]},
                "local_backends: backend_id must be unique; repeated: x",
            ),
            (
                {"now_ms": NOW, "peer": []},
                "unknown field(s) peer; accepted: now_ms, max_handoffs_per_cycle, reserve_after_ms, "
                "heartbeat_staleness_ms, local_backends, peers, jobs, ledger",
            ),
            (
                {"now_ms": NOW, "peers": [peer("a", reachble=True)]},
                "peers[0]: unknown field(s) reachble; accepted: peer_id, reachable, last_contact_ms, backends, "
                "active_jobs",
            ),
            ({"now_ms": NOW, "max_handoffs_per_cycle": 0}, "max_handoffs_per_cycle: must be >= 1"),
            ({"now_ms": NOW, "peers": [peer("a", active_jobs=-1)]}, "peers[0].active_jobs: must be >= 0"),
            ({"now_ms": NOW, "peers": [peer("a", active_jobs="2")]}, "peers[0].active_jobs: must be an integer"),
            ({"now_ms": NOW, "peers": [peer("a", active_jobs=1.5)]}, "peers[0].active_jobs: must be an integer"),
            ({"now_ms": NOW, "peers": [peer("a", active_jobs=True)]}, "peers[0].active_jobs: must be an integer"),
            ({"now_ms": NOW, "peers": [peer("a", active_jobs=None)]}, "peers[0].active_jobs: must be an integer"),
            ({"now_ms": NOW, "reserve_after_ms": -1}, "reserve_after_ms: must be >= 0"),
            ({"now_ms": NOW, "reserve_after_ms": "1800000"}, "reserve_after_ms: must be an integer"),
            ({}, "now_ms: is required"),
            (
                {"now_ms": NOW, "jobs": [gpu_job("/u/a"), gpu_job("/u/b", count=0)]},
                "jobs[1].resources.device.count: must be >= 1",
            ),
            ({"now_ms": NOW, "jobs": [{"job_id": "/u/a"}]}, "jobs[0].submitted_at_ms: is required"),
            (
                {"now_ms": NOW, "jobs": [cpu_job("/u/a", prefer=["h100", " "])]},
                "jobs[0].prefer: must list device variants such as h100",
            ),
            (
                {"now_ms": NOW, "jobs": [cpu_job("/u/a", prefer=[f"v{i}" for i in range(17)])]},
                "jobs[0].prefer: must have at most 16 items, got 17",
            ),
            (
                {"now_ms": NOW, "peers": [peer("a", gpu_backend("d", "h100", -1))]},
                "peers[0].backends[0].availability.amounts.h100: must be >= 0",
            ),
            (
                {"now_ms": NOW, "peers": [peer("a", gpu_backend("d", "h100", 1, held=[{"band": "x", "amounts": {}}]))]},
                "peers[0].backends[0].availability.held_by_band[0].band: unknown priority band 'x'",
            ),
            ([], "must be an object"),
        ],
    )
    def test_the_message_names_the_bad_path_and_nothing_is_printed(self, document, expected, capsys):
        code, stdout = run_cli(["simulate", "-"], json.dumps(document))
        assert code != 0
        assert stdout == ""
        assert expected in capsys.readouterr().err

    def test_every_problem_is_reported_at_once(self, capsys):
        document = {
            "now_ms": NOW,
            "surprise": 1,
            "jobs": [{"job_id": "bad", "submitted_at_ms": 0}, gpu_job("/u/b", count=0)],
        }
        code, _ = run_cli(["simulate", "-"], json.dumps(document))
        err = capsys.readouterr().err
        assert code != 0
        assert "unknown field(s) surprise" in err
        assert "jobs[0].job_id: must look like /<user>/<name>" in err
        assert "jobs[1].resources.device.count: must be >= 1" in err

    @pytest.mark.parametrize("text", ["{", '{"now_ms": 1,}', "", "nope"])
    def test_bad_json(self, text, capsys):
        code, stdout = run_cli(["simulate", "-"], text)
        assert (code, stdout) == (2, "")
        assert "- is not valid JSON" in capsys.readouterr().err

    def test_a_file_that_is_not_utf8(self, tmp_path, capsys):
        path = tmp_path / "state.json"
        path.write_bytes(b'\xff\xfe{"now_ms": 1}')
        code, stdout = run_cli(["simulate", str(path)])
        assert (code, stdout) == (2, "")
        assert f"{path} is not valid JSON" in capsys.readouterr().err

    def test_a_missing_file(self, tmp_path, capsys):
        code, stdout = run_cli(["simulate", str(tmp_path / "absent.json")])
        assert (code, stdout) == (2, "")
        assert "cannot read" in capsys.readouterr().err

    def test_simulate_raises_one_spec_error_for_the_library_caller(self):
        with pytest.raises(SpecError) as error:
            simulate({"now_ms": -1, "heartbeat_staleness_ms": -1})
        assert [p.path for p in error.value.problems] == ["now_ms", "heartbeat_staleness_ms"]


class TestCommandLine:
    def test_a_file_in_pretty_json_out(self, capsys):
        code, stdout = run_cli(["simulate", str(EXAMPLES / "simulate-contention.json")])
        assert code == 0
        assert json.loads(stdout) == simulate(load("simulate-contention.json"))
        assert stdout.count("\n") > 10
        assert capsys.readouterr().err == ""

    def test_stdin_compact_and_without_explanations(self):
        document = state(peer("cw", gpu_backend("d", "h100", 0)), jobs=[gpu_job("/u/a")])
        code, stdout = run_cli(["simulate", "-", "--compact", "--no-explain"], json.dumps(document))
        assert code == 0
        assert stdout.count("\n") == 1
        assert json.loads(stdout)["pending"] == [{"job_id": "/u/a", "reason": reasons.QUEUED_UNPINNED}]

    def test_the_installed_command(self, tmp_path):
        command = Path(sys.executable).with_name("iris-federation")
        assert command.exists(), "the iris-federation console script is not installed in this environment"
        good = subprocess.run(
            [str(command), "simulate", str(EXAMPLES / "simulate-seed.json")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert good.returncode == 0, good.stderr
        assert json.loads(good.stdout)["decisions"][0]["disposition"] == "reject"
        bad_path = tmp_path / "bad.json"
        bad_path.write_text(json.dumps({"now_ms": NOW, "jobs": [gpu_job("/u/a", count=0)]}))
        bad = subprocess.run([str(command), "simulate", str(bad_path)], capture_output=True, text=True, check=False)
        assert bad.returncode != 0
        assert bad.stdout == ""
        assert "jobs[0].resources.device.count: must be >= 1" in bad.stderr


# Random states: every queued job ends up in exactly one place, and the per-peer cap holds.


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    peers = []
    for i in range(draw(st.integers(0, 3))):
        backends = []
        for j in range(draw(st.integers(0, 2))):
            variant = draw(st.sampled_from(["h100", "a100"]))
            free = draw(st.sampled_from([None, 0, 8, 16]))
            held = [{"band": "batch", "amounts": {variant: 8}}] if draw(st.booleans()) else []
            backends.append(
                gpu_backend(f"b{j}", variant, free, epoch=draw(st.sampled_from([EPOCH, EPOCH + 1])), held=held)
            )
        age = draw(st.sampled_from([0, 0, 200_000]))
        peers.append(peer(f"p{i}", *backends, reachable=draw(st.booleans()), last_contact_ms=NOW - age))
    jobs = []
    for i in range(draw(st.integers(0, 8))):
        extra: dict[str, Any] = {
            "priority_band": draw(st.sampled_from(["batch", "interactive", "production"])),
            "scheduling_deadline_ms": draw(st.sampled_from([None, NOW - 1, NOW + 1])),
        }
        if peers and draw(st.integers(0, 3)) == 0:
            extra["target_cluster"] = draw(st.sampled_from([p["peer_id"] for p in peers]))
        if draw(st.booleans()):
            jobs.append(cpu_job(f"/u/j{i}", submitted=i, **extra))
        else:
            variant = draw(st.sampled_from(["h100", "a100"]))
            jobs.append(gpu_job(f"/u/j{i}", variant, draw(st.sampled_from([1, 8, 16])), submitted=i, **extra))
    ledger = [
        {"peer_id": p["peer_id"], "backend_id": b["backend_id"], "observation_epoch_ms": EPOCH, "reserved": {"h100": 4}}
        for p in peers
        for b in p["backends"]
        if draw(st.booleans())
    ]
    cap = draw(st.integers(1, 3))
    return state(*peers, jobs=jobs, ledger=ledger, max_handoffs_per_cycle=cap)


@settings(max_examples=150, deadline=None)
@given(documents())
def test_every_queued_job_lands_in_exactly_one_place(document):
    original = copy.deepcopy(document)
    output = simulate(document)
    assert document == original  # the input is not mutated
    queued = {d["job_id"] for d in output["decisions"] if d["disposition"] == "queue"}
    outcomes = Counter(
        [p["job_id"] for p in output["promotions"]] + [p["job_id"] for p in output["pending"]] + output["expired"]
    )
    assert set(outcomes) == queued
    assert all(n == 1 for n in outcomes.values())
    per_peer = Counter(p["peer_id"] for p in output["promotions"])
    assert all(n <= document["max_handoffs_per_cycle"] for n in per_peer.values())
    pins = {d["job_id"]: d["pinned_peer_id"] for d in output["decisions"]}
    for promotion in output["promotions"]:
        assert pins[promotion["job_id"]] in ("", promotion["peer_id"])
    for entry in output["pending"]:
        assert entry["reason"] == reasons.queued(pins[entry["job_id"]])
    keys = [(row["peer_id"], row["backend_id"]) for row in output["ledger"]]
    assert keys == sorted(set(keys))
    assert all(amount > 0 for row in output["ledger"] for amount in row["reserved"].values())
    assert json.loads(json.dumps(output)) == output


class TestCapacityContract:
    """The contract of issue 13: reject what can never fit, spread by jobs in flight, hold for starving jobs."""

    def h100_peer(self, peer_id: str, free: int, total: int | None = None, **fields: Any) -> dict[str, Any]:
        block = gpu_backend("default", "h100", free)
        if total is not None:
            block["availability"]["total_amounts"] = {"h100": total}
        return peer(peer_id, block, **fields)

    def test_a_job_bigger_than_every_matching_total_is_rejected_with_the_reason(self):
        output = simulate(state(self.h100_peer("cw-h100", 8, 8), jobs=[gpu_job("/a/big", count=16)]))
        assert output["decisions"] == [
            {
                "job_id": "/a/big",
                "disposition": "reject",
                "pinned_peer_id": "",
                "reason": (
                    "Job /a/big needs 16 h100 on one backend; the largest that can host it is cw-h100/default "
                    "with 8 in total"
                ),
            }
        ]
        assert (output["promotions"], output["pending"], output["reservations"]) == ([], [], [])

    def test_a_concrete_tpu_variant_is_gated_by_chips_like_a_gpu_variant(self):
        """Beyond the reference (which leaves TPUs ungated): two v5p-16 slices need 16 chips; a peer
        with 8 free of 8 in total rejects them and takes one slice, reserving its 8 chips."""
        block = gpu_backend("default", "v5p-16", 8)
        block["advertised_attributes"]["device-type"] = ["tpu"]
        block["availability"]["total_amounts"] = {"v5p-16": 8}
        tpu = {"device": {"type": "tpu", "variant": "v5p-16"}}
        jobs = [
            {"job_id": "/a/two", "submitted_at_ms": 0, "resources": {**tpu, "replicas": 2}},
            {"job_id": "/a/one", "submitted_at_ms": 1, "resources": tpu},
            {"job_id": "/a/auto", "submitted_at_ms": 2, "resources": {"device": {"type": "tpu", "count": 4}}},
        ]
        output = simulate(state(peer("gke", block), jobs=jobs))
        assert dispositions(output) == {"/a/two": "reject", "/a/one": "queue", "/a/auto": "queue"}
        assert output["decisions"][0]["reason"] == (
            "Job /a/two needs 16 v5p-16 on one backend; the largest that can host it is gke/default with 8 in total"
        )
        promoted = {p["job_id"]: p["reserved"] for p in output["promotions"]}
        assert promoted == {"/a/one": {"v5p-16": 8}, "/a/auto": {}}  # auto stays ungated

    def test_shape_only_backends_and_missing_totals_count_as_possibly_large_enough(self):
        for other in (peer("cw-shape", gpu_backend("default", "h100")), self.h100_peer("cw-nototal", 4)):
            output = simulate(state(self.h100_peer("cw-h100", 8, 8), other, jobs=[gpu_job("/a/big", count=16)]))
            assert dispositions(output) == {"/a/big": "queue"}

    def test_ungated_jobs_spread_by_active_jobs_plus_promotions_so_far(self):
        peers = [peer(name, gpu_backend("default", "h100", 0), active_jobs=n) for name, n in (("a", 2), ("b", 0))]
        output = simulate(state(*peers, jobs=[cpu_job(f"/u/{i}", submitted=i) for i in range(4)]))
        assert [p["peer_id"] for p in output["promotions"]] == ["b", "b", "a", "b"]
        # Absent, active_jobs is 0: the original spread.
        peers = [peer(name, gpu_backend("default", "h100", 0)) for name in ("a", "b")]
        output = simulate(state(*peers, jobs=[cpu_job(f"/u/{i}", submitted=i) for i in range(4)]))
        assert [p["peer_id"] for p in output["promotions"]] == ["a", "b", "a", "b"]

    def test_a_coordinator_preferring_h100_lands_where_the_most_are_free_and_takes_none(self):
        gpu_and_cpu = {"device-type": ["gpu"], "device-variant": ["h100"]}

        def cluster(name: str, free: int) -> dict[str, Any]:
            backend = gpu_backend("default", "h100", free)
            backend["advertised_attributes"] = gpu_and_cpu
            return peer(name, backend, active_jobs={"a": 0, "b": 4, "c": 0}[name])

        peers = [cluster("a", 0), cluster("b", 24), cluster("c", 8)]
        output = simulate(state(*peers, jobs=[cpu_job("/u/coord", prefer=["H100"])]))
        assert [(p["peer_id"], p["reserved"]) for p in output["promotions"]] == [("b", {})]
        assert output["ledger"] == []
        # Nobody reports what it prefers: it reads 0 everywhere and the spread decides, as without one.
        output = simulate(state(*peers, jobs=[cpu_job("/u/coord", prefer=["zz9"])]))
        assert [p["peer_id"] for p in output["promotions"]] == ["a"]

    def stream(self, **fields: Any) -> dict[str, Any]:
        jobs = [gpu_job("/alice/big", count=32, submitted=0), gpu_job("/bob/small", count=8, submitted=NOW - 10)]
        return state(self.h100_peer("cw-h100", 8, 32), jobs=jobs, **fields)

    def test_without_reserve_after_ms_existing_inputs_keep_their_meaning(self):
        for fields in ({}, {"reserve_after_ms": None}, {"reserve_after_ms": 0}):
            output = simulate(self.stream(**fields))
            assert placed(output) == {"/bob/small": ("cw-h100", "default")}
            assert output["reservations"] == []

    def test_a_starving_job_reserves_the_backend_and_nothing_after_it_goes_there(self):
        output = simulate(self.stream(reserve_after_ms=1_800_000 // 1000))
        assert output["reservations"] == [
            {
                "job_id": "/alice/big",
                "peer_id": "cw-h100",
                "backend_id": "default",
                "needs": {"h100": 32},
                "available": {"h100": 8},
            }
        ]
        assert output["promotions"] == []
        [big, small] = output["pending"]
        assert big["explanation"]["holding"]["text"] == "holding cw-h100/default for /alice/big (waiting 16 min)"
        assert small["explanation"]["peers"][0]["backends"][0]["hold"] == big["explanation"]["holding"]["text"]

    def test_eligibility_is_strictly_longer_than_reserve_after_ms(self):
        assert simulate(self.stream(reserve_after_ms=NOW))["reservations"] == []  # waited exactly that long
        assert len(simulate(self.stream(reserve_after_ms=NOW - 1))["reservations"]) == 1

    def test_reservations_come_in_queue_order_one_per_backend(self):
        jobs = [
            gpu_job("/b/second", count=32, submitted=5),
            gpu_job("/a/first", count=32, submitted=1, priority_band="production"),
            gpu_job("/c/third", count=32, submitted=9),
        ]
        peers = [self.h100_peer("p1", 8, 32), self.h100_peer("p2", 16, 32)]
        output = simulate(state(*peers, jobs=jobs, reserve_after_ms=1000))
        assert [(r["job_id"], r["peer_id"]) for r in output["reservations"]] == [
            ("/a/first", "p2"),
            ("/b/second", "p1"),
        ]

    def test_the_example(self):
        output = simulate(load("simulate-capacity.json"))
        assert dispositions(output) == {
            "/alice/big": "queue",
            "/bob/small": "queue",
            "/carol/huge": "reject",
            "/dave/etl": "queue",
        }
        assert [r["job_id"] for r in output["reservations"]] == ["/alice/big"]
        assert placed(output) == {"/dave/etl": ("cw-cpu", "default")}  # cw-h100 is held, even for CPU work

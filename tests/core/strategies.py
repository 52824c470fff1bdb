"""Hypothesis strategies for random federation states: peers, backends, queued jobs, ledgers."""

from __future__ import annotations

from hypothesis import strategies as st

from iris_airflow_provider.core.availability import Availability, PeerBackend, PeerState
from iris_airflow_provider.core.bands import Band
from iris_airflow_provider.core.constraints import Constraint, Op, normalize_advertised
from iris_airflow_provider.core.ledger import LedgerEntry
from iris_airflow_provider.core.placement import Candidate

NOW = 5_000_000
EPOCH = NOW - 20_000
STALENESS = 120_000
VARIANTS = ("h100", "a100", "gb200")
REGIONS = ("us-east", "us-west")
EPOCHS = (EPOCH - 1, EPOCH, EPOCH + 1)


@st.composite
def backends(draw: st.DrawFn, backend_id: str) -> PeerBackend:
    kind = draw(st.sampled_from(["gpu", "gpu", "gpu", "tpu", "cpu"]))
    attributes: dict[str, list[str]] = {"device-type": [kind]}
    if kind == "gpu":
        attributes["device-variant"] = draw(
            st.sampled_from([["h100"], ["h100"], ["a100"], ["gb200"], ["h100", "a100"]])
        )
    elif kind == "tpu":
        attributes["device-variant"] = ["v5p-8"]
    if draw(st.integers(0, 3)) == 0:
        attributes["region"] = draw(st.lists(st.sampled_from(REGIONS), min_size=1, max_size=2, unique=True))
    metric = draw(st.sampled_from(["none", "v2", "v2", "v2", "v2", "v2", "v3"]))
    availability = None
    if metric != "none":
        # Mostly the variants the backend advertises, now and then a stray token.
        tokens = list(attributes.get("device-variant", [])) if kind == "gpu" else []
        if draw(st.integers(0, 4)) == 0:
            tokens.append(draw(st.sampled_from(VARIANTS)))
        amounts = {t: draw(st.sampled_from([0, 0, 4, 8, 8, 16, 24, 40])) for t in tokens}
        held = {
            band: {t: draw(st.sampled_from([0, 4, 8, 16])) for t in tokens}
            for band in draw(st.lists(st.sampled_from(list(Band)), max_size=4, unique=True))
        }
        version = 3 if metric == "v3" else draw(st.sampled_from([1, 2, 2]))
        # Totals: none, or one per token (some too small for the larger jobs).
        totals = {t: draw(st.sampled_from([8, 16, 24, 32, 64])) for t in tokens if draw(st.booleans())}
        availability = Availability(version, draw(st.sampled_from(EPOCHS)), amounts, totals, held)
    return PeerBackend(backend_id, normalize_advertised(attributes), availability)


@st.composite
def peer_states(draw: st.DrawFn, peer_id: str) -> PeerState:
    count = draw(st.sampled_from([1, 1, 2, 2, 3, 0]))
    members = tuple(draw(backends(f"b{i}")) for i in range(count))
    reachable = draw(st.sampled_from([True] * 6 + [False]))
    last_contact = draw(st.sampled_from([NOW - 1_000] * 5 + [NOW - STALENESS, NOW - STALENESS - 1]))
    return PeerState(peer_id, reachable, last_contact, members)


@st.composite
def candidates(draw: st.DrawFn, index: int, peer_ids: list[str]) -> Candidate:
    device = draw(st.sampled_from(["gpu"] * 8 + ["tpu", "cpu"]))
    shape: list[Constraint] = []
    gate: tuple[tuple[str, int], ...] = ()
    if device != "cpu":
        shape.append(Constraint("device-type", Op.EQ, (device,)))
        # Mostly one variant, so candidates often share a class and compete for the same backends.
        variant = (
            draw(st.sampled_from(["h100", "h100", "h100", "a100", "gb200", "h100", "auto"]))
            if device == "gpu"
            else "v5p-8"
        )
        if variant != "auto":
            shape.append(Constraint("device-variant", Op.EQ, (variant,)))
            if device == "gpu":
                gate = ((variant, draw(st.sampled_from([1, 2, 4, 8, 8, 16, 24]))),)
    region = draw(st.sampled_from([None] * 8 + [*REGIONS, "both"]))
    if region == "both":
        shape.append(Constraint("region", Op.IN, REGIONS))
    elif region is not None:
        shape.append(Constraint("region", Op.EQ, (region,)))
    pin = draw(st.sampled_from(["", "", "", "", "", "", *peer_ids, "ghost"]))
    deadline = draw(st.sampled_from([None] * 8 + [NOW - 1, NOW, NOW + 1]))
    avoided = draw(st.sampled_from([[]] * 6 + [[p] for p in peer_ids] + [peer_ids]))
    # Mostly no preference; else room for one or two variants, now and then one nobody reports.
    prefer = draw(st.sampled_from([()] * 4 + [(v,) for v in VARIANTS] + [("h100", "a100"), ("zz9",)]))
    return Candidate(
        job_id=f"/u/job-{index}",
        band=draw(st.sampled_from(list(Band))),
        submitted_at_ms=draw(st.integers(0, 5)),
        pinned_peer_id=pin,
        shape=tuple(shape),
        gate=gate,
        deadline_ms=deadline,
        avoided_peer_ids=frozenset(avoided),
        prefer=prefer,
    )


@st.composite
def states(draw: st.DrawFn, max_jobs: int = 40) -> dict:
    peer_ids = [f"p{i}" for i in range(draw(st.sampled_from([1, 2, 2, 3, 3, 4, 0])))]
    peers = [draw(peer_states(pid)) for pid in peer_ids]
    jobs = [draw(candidates(i, peer_ids)) for i in range(draw(st.sampled_from([0, 1, 3, 8, 15, max_jobs])))]
    keys = [(p.peer_id, b.backend_id) for p in peers for b in p.backends] + [("gone", "b0")]
    ledger = [
        LedgerEntry(pid, bid, draw(st.sampled_from(EPOCHS)), {t: draw(st.integers(0, 8)) for t in VARIANTS[:2]})
        for pid, bid in draw(st.lists(st.sampled_from(keys), max_size=4))
    ]
    return {
        "peers": peers,
        "jobs": jobs,
        "ledger": ledger,
        "cap": draw(st.sampled_from([8, 8, 3, 1])),
        **draw(extras(peer_ids, jobs, keys)),
    }


@st.composite
def extras(draw: st.DrawFn, peer_ids: list[str], jobs: list[Candidate], keys: list[tuple[str, str]]) -> dict:
    """Jobs in flight per peer, last tick's holds, and how long a job waits before it may hold."""
    active = {pid: draw(st.integers(0, 3)) for pid in peer_ids if draw(st.booleans())}
    previous = {c.job_id: draw(st.sampled_from(keys)) for c in jobs if keys and c.gate and draw(st.integers(0, 3)) == 0}
    # Jobs are submitted at 0..5: NOW - 3 makes those submitted before 3 eligible.
    reserve_after = draw(st.sampled_from([None, None, 0, NOW - 3, NOW - 3, 1]))
    return {"active": active, "previous_holds": previous, "reserve_after": reserve_after}


@st.composite
def contended_states(draw: st.DrawFn) -> dict:
    """Several h100 backends with idle and held capacity, and h100 jobs of every size and band.

    Narrow on purpose: every job competes for the same backends, so ranking (idle first, tightest
    fit, ties), reclaim and the skip-when-nothing-can-fit bound are exercised on every example.
    """
    peers = []
    for p in range(draw(st.integers(1, 3))):
        members = []
        for b in range(draw(st.integers(1, 3))):
            held = {
                band: {"h100": draw(st.sampled_from([0, 4, 8, 16]))}
                for band in draw(st.lists(st.sampled_from(list(Band)), max_size=4, unique=True))
            }
            total = draw(st.sampled_from([{}, {"h100": 16}, {"h100": 32}, {"h100": 64}]))
            availability = Availability(2, EPOCH, {"h100": draw(st.sampled_from([0, 4, 8, 12, 16, 24]))}, total, held)
            members.append(
                PeerBackend(
                    f"b{b}", normalize_advertised({"device-type": ["gpu"], "device-variant": ["h100"]}), availability
                )
            )
        peers.append(PeerState(f"p{p}", True, NOW - 1_000, tuple(members)))
    shape = (Constraint("device-type", Op.EQ, ("gpu",)), Constraint("device-variant", Op.EQ, ("h100",)))
    jobs = [
        Candidate(
            job_id=f"/u/job-{i}",
            band=draw(st.sampled_from(list(Band))),
            submitted_at_ms=draw(st.integers(0, 3)),
            shape=shape,
            gate=(("h100", draw(st.sampled_from([1, 2, 4, 8, 12, 16, 24, 32]))),),
            prefer=draw(st.sampled_from([(), (), ("h100",), ("a100",)])),
        )
        for i in range(draw(st.integers(1, 30)))
    ]
    keys = [(p.peer_id, b.backend_id) for p in peers for b in p.backends]
    return {
        "peers": peers,
        "jobs": jobs,
        "ledger": [],
        "cap": draw(st.sampled_from([8, 8, 2])),
        **draw(extras([p.peer_id for p in peers], jobs, keys)),
    }

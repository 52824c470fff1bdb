"""The bundle store's retention rule: what goes, what never goes, and whether a new upload fits."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from iris_airflow_provider.core.bundle_retention import (
    BUDGET_GRACE_MS,
    PartialUpload,
    RetentionRules,
    StoredBundle,
    StrayFile,
    plan_collection,
    upload_refusal,
)

NOW = 10_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
RULES = RetentionRules(keep_unused_ms=DAY, keep_partial_ms=HOUR, max_total_bytes=1000)


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


def bundle(n: int, size: int, age_ms: int) -> StoredBundle:
    return StoredBundle(digest(n), size, NOW - age_ms)


def test_unreferenced_bundles_unused_past_keep_unused_go() -> None:
    old, fresh, live = bundle(1, 10, DAY), bundle(2, 10, DAY - 1), bundle(3, 10, 10 * DAY)
    plan = plan_collection([old, fresh, live], [], {live.digest}, NOW, RULES)
    assert plan.bundles == (old,)
    assert (plan.total_bytes, plan.remaining_bytes, plan.freed_bytes) == (30, 20, 10)


def test_partial_uploads_not_written_for_keep_partial_go() -> None:
    stale, writing = PartialUpload(digest(1), 5, NOW - HOUR), PartialUpload(digest(2), 5, NOW - HOUR + 1)
    plan = plan_collection([], [writing, stale], set(), NOW, RULES)
    assert plan.partials == (stale,)
    assert plan.bundles == ()


def test_over_budget_least_recently_used_go_first_but_never_within_the_grace() -> None:
    rules = RetentionRules(keep_unused_ms=DAY, keep_partial_ms=HOUR, max_total_bytes=100)
    oldest, older, just_used = bundle(1, 60, 3 * HOUR), bundle(2, 60, 2 * HOUR), bundle(3, 60, BUDGET_GRACE_MS - 1)
    plan = plan_collection([just_used, older, oldest], [], set(), NOW, rules)
    assert plan.bundles == (oldest, older)  # 180 -> 60; the one just used stays
    assert plan.remaining_bytes == 60
    # one is enough when the budget allows 120
    plan = plan_collection([just_used, older, oldest], [], set(), NOW, RetentionRules(max_total_bytes=120))
    assert plan.bundles == (oldest,)


def test_a_referenced_bundle_stays_even_when_the_store_stays_over_budget() -> None:
    rules = RetentionRules(max_total_bytes=10)
    live = bundle(1, 100, 100 * DAY)
    plan = plan_collection([live], [], {live.digest}, NOW, rules)
    assert plan.bundles == ()
    assert plan.remaining_bytes == 100


def test_an_upload_is_refused_when_it_cannot_fit_even_after_collection() -> None:
    rules = RetentionRules(max_total_bytes=100)
    live, collectable = bundle(1, 50, DAY), bundle(2, 30, HOUR)
    assert upload_refusal(digest(9), 50, [live, collectable], [], {live.digest}, NOW, rules) == ""
    problem = upload_refusal(digest(9), 51, [live, collectable], [], {live.digest}, NOW, rules)
    assert "bundles.max_total_bytes" in problem and digest(9) in problem and "of which 30 can be let go" in problem
    assert upload_refusal(digest(9), 101, [], [], set(), NOW, rules) != ""


def test_the_bytes_live_uploads_have_still_to_send_are_promised_to_them() -> None:
    rules = RetentionRules(keep_partial_ms=HOUR, max_total_bytes=100)
    live = PartialUpload(digest(1), 10, NOW - HOUR + 1, declared_size=60)  # 10 written, 50 to come
    assert live.to_come == 50
    assert upload_refusal(digest(9), 40, [], [live], set(), NOW, rules) == ""
    problem = upload_refusal(digest(9), 41, [], [live], set(), NOW, rules)
    assert "uploads in progress have 50 bytes still to come" in problem
    # An upload abandoned for keep_partial is promised nothing, and what it wrote can go.
    abandoned = PartialUpload(digest(1), 10, NOW - HOUR, declared_size=60)
    assert upload_refusal(digest(9), 100, [], [abandoned], set(), NOW, rules) == ""
    # One begun before sizes were kept counts for what it wrote only.
    assert PartialUpload(digest(2), 10, NOW, declared_size=0).to_come == 0


def test_stray_files_count_toward_the_budget_and_go_after_keep_partial() -> None:
    rules = RetentionRules(keep_partial_ms=HOUR, max_total_bytes=100)
    dead, writing = StrayFile(".packing-a", 30, NOW - HOUR), StrayFile(".packing-b", 20, NOW - HOUR + 1)
    plan = plan_collection([], [], set(), NOW, rules, strays=[writing, dead])
    assert plan.strays == (dead,)
    assert (plan.total_bytes, plan.remaining_bytes) == (50, 20)
    assert upload_refusal(digest(9), 80, [], [], set(), NOW, rules, strays=[writing, dead]) == ""
    assert upload_refusal(digest(9), 81, [], [], set(), NOW, rules, strays=[writing, dead]) != ""


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), max_size=30), budget=st.integers(1, 2000))
def test_uploads_admitted_one_at_a_time_never_together_pass_the_budget(sizes: list[int], budget: int) -> None:
    rules = RetentionRules(max_total_bytes=budget)
    admitted: list[PartialUpload] = []  # none has sent a byte yet
    for n, size in enumerate(sizes):
        promised = sum(p.declared_size for p in admitted)
        refused = upload_refusal(digest(n), size, [], admitted, set(), NOW, rules)
        assert (refused == "") == (promised + size <= budget)  # refused exactly when it does not fit
        if not refused:
            admitted.append(PartialUpload(digest(n), 0, NOW, declared_size=size))  # its room promised
    assert sum(p.declared_size for p in admitted) <= budget


entries = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 500), st.integers(0, 3 * DAY)), max_size=25, unique_by=lambda e: e[0]
)


@settings(max_examples=300, deadline=None)
@given(
    stored=entries,
    partial=entries,
    referenced=st.sets(st.integers(1, 30), max_size=10),
    budget=st.integers(0, 5000),
    seed=st.integers(0, 2**16),
)
def test_properties(
    stored: list[tuple[int, int, int]],
    partial: list[tuple[int, int, int]],
    referenced: set[int],
    budget: int,
    seed: int,
) -> None:
    rules = RetentionRules(keep_unused_ms=DAY, keep_partial_ms=HOUR, max_total_bytes=budget)
    bundles = [bundle(n, size, age) for n, size, age in stored]
    partials = [PartialUpload(digest(n), size, NOW - age, declared_size=size * 2) for n, size, age in partial]
    strays = [StrayFile(f".packing-{n}", size, NOW - age) for n, size, age in partial[::2]]
    live = {digest(n) for n in referenced}
    plan = plan_collection(bundles, partials, live, NOW, rules, strays=strays)

    chosen = {b.digest for b in plan.bundles}
    assert not chosen & live  # a referenced bundle is never chosen
    assert all(NOW - b.last_used_ms >= BUDGET_GRACE_MS for b in plan.bundles)
    assert all(NOW - f.last_written_ms >= HOUR for f in plan.strays)
    assert plan.total_bytes == sum(b.size for b in bundles) + sum(p.size for p in partials) + sum(
        f.size for f in strays
    )
    assert plan.remaining_bytes == plan.total_bytes - sum(b.size for b in plan.bundles) - sum(
        p.size for p in plan.partials
    ) - sum(f.size for f in plan.strays)
    collectable = (
        sum(b.size for b in bundles if b.digest not in live and NOW - b.last_used_ms >= BUDGET_GRACE_MS)
        + sum(p.size for p in plan.partials)
        + sum(f.size for f in plan.strays)
    )
    if plan.total_bytes - collectable <= budget:  # enough unreferenced old bytes existed
        assert plan.remaining_bytes <= budget
    # without budget pressure, only what outlived its keep goes
    expired = [b for b in bundles if b.digest not in live and NOW - b.last_used_ms >= DAY]
    left = plan.total_bytes - sum(b.size for b in expired) - sum(p.size for p in plan.partials)
    if left - sum(f.size for f in plan.strays) <= budget:
        assert set(plan.bundles) == set(expired)
    # deterministic, whatever order the store listed things in
    shuffler = random.Random(seed)
    shuffled_bundles, shuffled_partials = bundles[:], partials[:]
    shuffler.shuffle(shuffled_bundles)
    shuffler.shuffle(shuffled_partials)
    shuffled_strays = strays[:]
    shuffler.shuffle(shuffled_strays)
    assert plan_collection(shuffled_bundles, shuffled_partials, live, NOW, rules, strays=shuffled_strays) == plan

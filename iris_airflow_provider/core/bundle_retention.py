"""Which workdir bundles a cluster's bundle store lets go, and whether a new upload still fits.

The store (``backends/bundles.py``) holds complete bundles, each with when it was last used, partial
uploads, each with when it was last written to and the size its bundle will have, and stray files
(what a packer or a collector that died left behind). The rule, applied by the placement tick:

- a partial upload nobody has written to for ``keep_partial_ms`` is abandoned: it goes; so does a
  stray file untouched for as long;
- a complete bundle no live job refers to and unused for ``keep_unused_ms`` goes;
- while what is left is over ``max_total_bytes``, unreferenced bundles go, least recently used
  first, but never one used in the last :data:`BUDGET_GRACE_MS`.

A new upload is admitted only if the store has room for it beside everything it holds and every
live upload's bytes still to come (each is admitted, and its room promised, one at a time), once
whatever can go is gone: several uploads admitted together never take the store past its budget.

A bundle a live job refers to is never chosen. The grace is there because "referenced" is read
from the job store while "used" is read from the bundle store, and between the two a job can be
admitted on the strength of a bundle (a peer's receiver checks the bundle is here, then writes the
job; a parent packs the bundle, then admits the job): such a bundle was used a moment ago, so it
is spared until its job is visible as a reference.

Pure: the caller lists the store and the live jobs' digests, and carries the decision out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

# Longer than any admission takes between "the bundle is here" and "the job is stored".
BUDGET_GRACE_MS = 5 * 60_000
DEFAULT_KEEP_UNUSED_SECONDS = 86_400
DEFAULT_KEEP_PARTIAL_SECONDS = 3_600
DEFAULT_MAX_TOTAL_BYTES = 50 * 2**30
MAX_TOTAL_BYTES_CEILING = 2**50  # 1 PiB: a bound on a typo, not a recommendation


@dataclass(frozen=True, slots=True)
class StoredBundle:
    digest: str
    size: int
    last_used_ms: int


@dataclass(frozen=True, slots=True)
class PartialUpload:
    """An upload in progress: ``size`` bytes written of the ``declared_size`` its bundle has (0: not
    known, for an upload begun before sizes were kept: what is written is all it counts for)."""

    digest: str
    size: int
    last_written_ms: int
    declared_size: int = 0

    @property
    def to_come(self) -> int:
        """The bytes still to be written: room the store has promised it."""
        return max(0, self.declared_size - self.size)


@dataclass(frozen=True, slots=True)
class StrayFile:
    """A file of the store that is no bundle and no upload: a packer or collector died writing it."""

    name: str
    size: int
    last_written_ms: int


@dataclass(frozen=True, slots=True)
class RetentionRules:
    keep_unused_ms: int = DEFAULT_KEEP_UNUSED_SECONDS * 1000
    keep_partial_ms: int = DEFAULT_KEEP_PARTIAL_SECONDS * 1000
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    grace_ms: int = BUDGET_GRACE_MS

    def abandoned(self, last_written_ms: int, now_ms: int) -> bool:
        """Whether an upload (or a stray file) nobody has written to since ``last_written_ms`` is."""
        return now_ms - last_written_ms >= self.keep_partial_ms


@dataclass(frozen=True, slots=True)
class BundleCollection:
    """What to delete (in this order) and the store's size before and after."""

    bundles: tuple[StoredBundle, ...]
    partials: tuple[PartialUpload, ...]
    total_bytes: int
    remaining_bytes: int
    strays: tuple[StrayFile, ...] = ()

    @property
    def freed_bytes(self) -> int:
        return self.total_bytes - self.remaining_bytes


def _lru_order(bundle: StoredBundle) -> tuple[int, str]:
    return bundle.last_used_ms, bundle.digest


def plan_collection(
    bundles: Iterable[StoredBundle],
    partials: Iterable[PartialUpload],
    referenced: Collection[str],
    now_ms: int,
    rules: RetentionRules,
    *,
    strays: Iterable[StrayFile] = (),
    budget_bytes: int | None = None,
) -> BundleCollection:
    """What the store lets go at ``now_ms`` (``budget_bytes``: the size to get under, by default
    ``rules.max_total_bytes``)."""
    budget = rules.max_total_bytes if budget_bytes is None else budget_bytes
    all_bundles = sorted(bundles, key=_lru_order)
    all_partials = sorted(partials, key=lambda p: (p.last_written_ms, p.digest))
    all_strays = sorted(strays, key=lambda f: (f.last_written_ms, f.name))
    total = sum(b.size for b in all_bundles) + sum(p.size for p in all_partials) + sum(f.size for f in all_strays)
    stale_partials = tuple(p for p in all_partials if rules.abandoned(p.last_written_ms, now_ms))
    stale_strays = tuple(f for f in all_strays if rules.abandoned(f.last_written_ms, now_ms))
    unreferenced = [b for b in all_bundles if b.digest not in referenced]
    chosen = [b for b in unreferenced if now_ms - b.last_used_ms >= rules.keep_unused_ms]
    remaining = total - sum(p.size for p in stale_partials) - sum(f.size for f in stale_strays)
    remaining -= sum(b.size for b in chosen)
    picked = {b.digest for b in chosen}
    for bundle in unreferenced:  # least recently used first
        if remaining <= budget:
            break
        if bundle.digest in picked or now_ms - bundle.last_used_ms < rules.grace_ms:
            continue
        chosen.append(bundle)
        picked.add(bundle.digest)
        remaining -= bundle.size
    return BundleCollection(
        bundles=tuple(sorted(chosen, key=_lru_order)),
        partials=stale_partials,
        total_bytes=total,
        remaining_bytes=remaining,
        strays=stale_strays,
    )


def upload_refusal(
    digest: str,
    size: int,
    bundles: Iterable[StoredBundle],
    partials: Iterable[PartialUpload],
    referenced: Collection[str],
    now_ms: int,
    rules: RetentionRules,
    *,
    strays: Iterable[StrayFile] = (),
) -> str:
    """Why a new upload of ``size`` bytes may not start ("" when it fits): the store would be over
    ``max_total_bytes`` with it and the bytes live uploads have still to send, even once everything
    collectable is gone."""
    partials = list(partials)
    promised = sum(p.to_come for p in partials if not rules.abandoned(p.last_written_ms, now_ms))
    plan = plan_collection(
        bundles,
        partials,
        referenced,
        now_ms,
        rules,
        strays=strays,
        budget_bytes=max(0, rules.max_total_bytes - size - promised),
    )
    if plan.remaining_bytes + promised + size <= rules.max_total_bytes:
        return ""
    return (
        f"bundle {digest} of {size} bytes does not fit in this cluster's bundle store "
        f"(bundles.max_total_bytes: {rules.max_total_bytes}): it holds {plan.total_bytes} bytes, of which "
        f"{plan.freed_bytes} can be let go (the rest belongs to live jobs, uploads in progress or bundles "
        f"used in the last minutes), and uploads in progress have {promised} bytes still to come"
    )

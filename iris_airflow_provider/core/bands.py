"""Priority bands, compared by rank rather than by wire number.

The reference compares raw enum numbers; we compare an explicit rank so that a band added
between two others (the reference's newest ``PRIORITY``) cannot mis-order reclaim or queue order.
"""

from __future__ import annotations

from enum import IntEnum

BAND_PREFIX = "PRIORITY_BAND_"


class Band(IntEnum):
    """A priority band. ``rank`` (its value): lower is more important.

    An ``IntEnum`` so that ordering and hashing run in C: placement sorts and groups every queued
    job by band on every tick.
    """

    PRODUCTION = 0
    PRIORITY = 1
    INTERACTIVE = 2
    BATCH = 3

    @property
    def rank(self) -> int:
        return self.value

    @property
    def wire_name(self) -> str:
        return BAND_PREFIX + self.name

    def outranks(self, other: Band) -> bool:
        """Whether work in this band may reclaim capacity held by ``other``."""
        return self.rank < other.rank


DEFAULT_BAND = Band.INTERACTIVE
ACCEPTED_BAND_NAMES = tuple(band.name.lower() for band in Band)


class UnknownBandError(ValueError):
    pass


def parse_band(raw: str, *, unspecified: Band | None = DEFAULT_BAND) -> Band | None:
    """Parse a band name, case-insensitive, with or without the ``PRIORITY_BAND_`` prefix.

    ``UNSPECIFIED`` maps to ``unspecified`` (interactive for a job; ``None`` where it must be
    ignored, as in a heartbeat's ``held_by_band``). Anything else unknown raises.
    """
    name = raw.strip().upper()
    name = name.removeprefix(BAND_PREFIX)
    if name == "UNSPECIFIED":
        return unspecified
    try:
        return Band[name]
    except KeyError:
        accepted = ", ".join((*ACCEPTED_BAND_NAMES, "unspecified"))
        raise UnknownBandError(
            f"unknown priority band {raw!r}; accepted: {accepted} (with or without the {BAND_PREFIX} prefix, any case)"
        ) from None

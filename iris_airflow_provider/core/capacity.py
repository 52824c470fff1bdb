"""A backend's spendable capacity during one placement pass: idle first, then reclaim.

A candidate may count, on top of the free amount, what strictly lower bands hold on that backend
(the work the peer's scheduler would preempt to admit it). Spending takes idle capacity first,
then reclaims from the lowest band upward, so higher-priority work is left alone longest.
"""

from __future__ import annotations

from collections.abc import Mapping

from iris_airflow_provider.core.availability import Availability

# Rank used to replay ledger reservations, which do not record the band that made them: it
# outranks every band, so a replay may reclaim from any of them (the reference's ANY_BAND).
ANY_RANK = -1


class WorkingCapacity:
    __slots__ = ("free", "held")

    def __init__(self, availability: Availability) -> None:
        self.free: dict[str, int] = dict(availability.amounts)
        # Lowest priority first: the order in which held work is reclaimed.
        self.held: list[tuple[int, dict[str, int]]] = sorted(
            ((band.rank, dict(amounts)) for band, amounts in availability.held_by_band.items()),
            key=lambda item: -item[0],
        )

    def available(self, token: str, rank: int) -> int:
        """Free plus everything held by bands that ``rank`` outranks."""
        total = self.free.get(token, 0)
        for held_rank, amounts in self.held:
            if held_rank <= rank:
                break
            total += amounts.get(token, 0)
        return total

    def reclaimable(self, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for held_rank, amounts in self.held:
            if held_rank <= rank:
                break
            for token, amount in amounts.items():
                out[token] = out.get(token, 0) + amount
        return out

    def spend(self, token: str, amount: int, rank: int) -> None:
        free = self.free.get(token, 0)
        take = min(free, amount)
        self.free[token] = free - take
        remaining = amount - take
        for held_rank, amounts in self.held:
            if remaining <= 0 or held_rank <= rank:
                return
            taken = min(amounts.get(token, 0), remaining)
            amounts[token] = amounts.get(token, 0) - taken
            remaining -= taken

    def replay(self, reserved: Mapping[str, int]) -> None:
        for token, amount in reserved.items():
            self.spend(token, amount, ANY_RANK)

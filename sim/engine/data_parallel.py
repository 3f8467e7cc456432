"""A replica with data-parallel attention: `dp` ranks, each a scheduler of its own, stepping together.

vLLM runs each DP rank as an engine of its own (`--data-parallel-size`): its own scheduler with the policy's
`max_num_seqs` and `max_num_batched_tokens`, its own KV blocks (the replica's, split evenly over the ranks),
its own waiting queue. A request stays on the rank it was given (its KV is there). The front end gives an
arriving request to the rank of least `4 x waiting + running` (vLLM's `DPLBAsyncMPClient`; ties to the
lowest rank); the counts here are the ranks' own at the arrival, where vLLM's front end reads them as the DP
coordinator publishes them (every 100 ms) and counts its own sends in between.

With MoE layers shared over EP the ranks step in lockstep: every step, each rank plans its own rows, and the
step is their union, costed by the placement over each rank's rows (`RankedPlan.rank_sizes`,
`sim.cost.parallel.ParallelCost`): the step waits for the slowest rank. A rank with nothing to run sits the
step out (vLLM runs it a dummy batch, not charged here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget

WAITING_WEIGHT = 4  # vLLM's DPLBAsyncMPClient: score = waiting x 4 + running


@dataclass(slots=True)
class RankedPlan(StepPlan):
    """A step of a DP replica: its ranks' rows in rank order, `rank_sizes` rows each; `payload` is each
    rank's own plan (None for a rank sitting the step out)."""

    rank_sizes: tuple[int, ...] = ()


def rank_budgets(budget: KvBudget, dp: int) -> list[KvBudget]:
    """The replica's KV blocks split over its `dp` ranks (the first `num_blocks % dp` take one more)."""
    share, extra = divmod(budget.num_blocks, dp)
    return [KvBudget(share + (r < extra), budget.block_size, budget.max_model_len) for r in range(dp)]


def _capacity(scheduler: Any, budget: KvBudget) -> int:
    """The KV slots a rank's plans report as capacity: its paged policy's own (the usable blocks; through a
    decode replica's `PagedDecode`), else its budget's tokens (reservations)."""
    capacity = getattr(getattr(scheduler, "inner", scheduler), "capacity", None)
    return capacity if isinstance(capacity, int) else budget.num_tokens


class DataParallelRanks:
    """The scheduler of a DP replica over `ranks`, one scheduler each (see the module docstring)."""

    def __init__(self, ranks: Sequence[Any], budgets: Sequence[KvBudget]) -> None:
        self.ranks = list(ranks)
        self.in_system = [0] * len(self.ranks)  # each rank's requests added and not finished
        self.rank_of: dict[int, int] = {}  # request id -> its rank
        # each rank's KV usage as its latest plan gave it (empty, at its capacity, before its first)
        self.usage = [KvUsage(0, 0, _capacity(r, b)) for r, b in zip(self.ranks, budgets, strict=True)]

    @property
    def num_waiting(self) -> int:
        return sum(int(r.num_waiting) for r in self.ranks)

    @property
    def admitted_at(self) -> dict[int, float]:
        """A decode replica's first admissions (`PagedDecode.admitted_at`), over its ranks."""
        out: dict[int, float] = {}
        for r in self.ranks:
            out.update(getattr(r, "admitted_at", {}))
        return out

    def pick(self) -> int:
        """The rank an arrival goes to: the least `4 x waiting + running`, the lowest of equals."""

        def score(i: int) -> int:
            waiting = int(self.ranks[i].num_waiting)
            return WAITING_WEIGHT * waiting + self.in_system[i] - waiting  # in_system - waiting: running

        return min(range(len(self.ranks)), key=score)  # the first of equals

    def add(self, request: Request, now: float) -> bool:
        r = self.pick()
        if not self.ranks[r].add(request, now):
            return False
        self.in_system[r] += 1
        self.rank_of[request.id] = r
        return True

    def pipeline(self, in_flight: int) -> bool:
        """Batches in flight (sim/engine/pipeline.py) when every rank keeps them."""
        kept = [bool(getattr(r, "pipeline", lambda _: False)(in_flight)) for r in self.ranks]
        return all(kept)

    def schedule(self, now: float) -> StepPlan | None:
        plans = [r.schedule(now) for r in self.ranks]
        live = [p for p in plans if p is not None]
        if not live:
            return None
        for i, p in enumerate(plans):
            if p is not None:
                self.usage[i] = p.kv
        usage = self.usage
        used, allocated = sum(u.used for u in usage), sum(u.allocated for u in usage)
        kv = KvUsage(used, allocated, sum(u.capacity for u in usage))
        return RankedPlan(
            new_tokens=np.concatenate([p.new_tokens for p in live]),
            context=np.concatenate([p.context for p in live]),
            num_prefill_tokens=sum(p.num_prefill_tokens for p in live),
            num_decode_tokens=sum(p.num_decode_tokens for p in live),
            kv=kv,
            payload=plans,
            preempted=sum(p.preempted for p in live),
            batch_size=sum(p.batch_size for p in live),
            rank_sizes=tuple(0 if p is None else len(p.new_tokens) for p in plans),
        )

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        finished: list[Request] = []
        for r, p in zip(self.ranks, plan.payload, strict=True):
            if p is not None:
                finished.extend(r.update(p, now))
        for req in finished:
            self.in_system[self.rank_of.pop(req.id)] -= 1
        return finished

    def wake_at(self, now: float) -> float | None:
        times = [t for r in self.ranks if (t := r.wake_at(now)) is not None]
        return min(times) if times else None

    def in_flight(self) -> list[Request]:
        return [req for r in self.ranks for req in r.in_flight()]

"""Decode-only runs of the vllm policy in fast mode, advanced at once (`QuietRuns`).

When every running sequence is in bulk (bulk.py) and nobody waits, the next steps decode one token per
sequence and nothing else: nobody is admitted (nothing waits, and an arrival is seen only by a later step),
none of the rows is handled by itself (no sequence is due a row of its own), the token budget cannot bind,
and the blocks the sequences open on the way can be lent (`_lend_blocks`). Such steps run up to the step
before the first sequence is due a row of its own, or through the first step where somebody finishes, or
while the free blocks last; with arrivals held that the next step was formed before (asynchronous
scheduling), that one step alone. `quiet_steps` vouches for them; the engine costs and records them from their
totals alone, and `advance_quiet` applies them as `schedule` and `update` of each would have: the blocks lent
(taken from the pool in the same order), the step gaps the sequences' ITL maxima read, and the finishes of
the last step.

`QuietRuns` extends `BulkDecoding` (bulk.py) as one of the parts `VllmScheduler` (scheduler.py) is made of.
"""

from __future__ import annotations

import heapq
from collections import deque

from sim.core.request import Request
from sim.core.step import QuietSteps
from sim.engine.schedulers.vllm.bulk import GAPS_KEPT, BulkDecoding
from sim.engine.schedulers.vllm.plan import Seq


class QuietRuns(BulkDecoding):
    """The decode-only steps a scheduler in fast mode can vouch for, and their application (see the module
    docstring)."""

    # shared with the other parts of `VllmScheduler`
    token_budget: int
    waiting: deque[Seq]
    _held: deque[tuple[float, list[Seq]]]
    _step_start: float
    _opened: list[int]  # without prefix caching: the blocks each of the next block-size steps lends

    def quiet_steps(self) -> QuietSteps | None:
        """The decode-only steps from the next one on that only the sequences in bulk run (see the module
        docstring); None when the next step may do anything else."""
        n = self._bulk_n
        if not self.fast or not n or self._busy or self.waiting or n >= self.token_budget:
            return None
        held = bool(self._held)  # then only the next step, if it was formed before every held arrival came
        if held and not self.blind_to_held(self._step_start):
            return None
        first = self._step + 1
        last = first + (1 << 62)
        events, finishes = self._events, self._finishes
        while events and events[0][3].bulk_since != events[0][2]:
            heapq.heappop(events)  # stale: that sequence left bulk since
        if events:
            last = events[0][0] - 1  # due a row of its own there
        while finishes and finishes[0][3].bulk_since != finishes[0][2]:
            heapq.heappop(finishes)
        if finishes and finishes[0][0] < last:
            last = finishes[0][0]  # through the first finish
        if last < first:
            return None
        kv, bs = self.kv, self.block_size
        opened: list[int] = []
        steps = 1 if held else last - first + 1
        if self._lazy:
            counts = list(map(len, self._phases))
            per_cycle = sum(counts)
            if per_cycle:
                at = first % bs
                opened = counts[at:] + counts[:at]  # blocks lent at step first + j, j < bs
                # while the free blocks last: step j lends its blocks when they cover them (`_lend_blocks`)
                free = kv.num_free
                cycles = free // per_cycle
                if cycles * bs < steps:
                    room, fit = free - cycles * per_cycle, 0
                    for m in opened:
                        if m > room:
                            break
                        room -= m
                        fit += 1
                    steps = min(steps, cycles * bs + fit)
                    if not steps:
                        return None
            self._opened = opened
        heap = self._bulk_max
        while heap[0][3].bulk_since != heap[0][1]:
            heapq.heappop(heap)
        allocated = kv.allocated
        used = allocated - kv.waste + n
        max_end = first - heap[0][0] + 1
        ctx = self._bulk_ctx + n * first
        return QuietSteps(steps, n, ctx, max_end, used, n, allocated, kv.capacity, opened, bs)

    def blind_to_held(self, since: float) -> bool:
        """Whether the next step, formed back to back with the one that started at `since` and just ended,
        sees none of the requests held (asynchronous scheduling: each came after that step was formed) and
        nothing else waits, so that it admits nobody."""
        held = self._held
        return bool(held) and not self.waiting and held[0][0] > since

    def advance_quiet(self, start: float, ends: list[float]) -> list[Request]:
        """Apply the first `len(ends)` of `quiet_steps`'s steps (the first starting at `start`, step j ending
        at `ends[j]`), as `schedule` and `update` of each would; the requests that finished in the last."""
        count = len(ends)
        first = self._step + 1
        last = first + count - 1
        kv = self.kv
        if self._lazy:
            per_step = self._opened  # as `quiet_steps` found them: nothing changed the phases since
            cycles, rest = divmod(count, self.block_size)
            opened = sum(per_step[:rest])
            if cycles:
                opened += cycles * sum(per_step)
            if opened:
                self._lent += kv.lend(opened)  # the blocks of each step in turn, as one take
            self._crossed = last
        kv.filled(self._bulk_n * count)
        gaps, prev = self._gaps, self._last_end
        for step, end in enumerate(ends, first):
            gaps.append(step, end - prev)
            prev = end
        self._step = self._updated = last
        self._step_start = ends[-2] if count > 1 else start
        self._last_end = ends[-1]
        done: list[Seq] = []
        self._finish_bulk(last, done)
        finished = self._close_done(done) if done else []
        if last // GAPS_KEPT != (first - 1) // GAPS_KEPT:
            self._trim_gaps()
        return finished

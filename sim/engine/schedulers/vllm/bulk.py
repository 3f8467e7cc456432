"""Bulk decoding for the vllm policy (`VllmScheduler(fast=True)`, what `sim run` builds): `BulkDecoding`.

A running sequence of a one-sequence request that will decode one token per step within its blocks for a
while is left alone ("in bulk") and counted in the plans' totals; its fields are brought up to date (`_wake`)
when it next needs a row of its own (a new block, the length limit), finishes, is preempted, or is read
(`in_flight`). `StepInfo` then lists only the rows handled one by one. The records are those of the same
scheduler stepping every row (tests/test_vllm_bulk.py; docs/performance.md).

`BulkDecoding` is one of the parts `VllmScheduler` (scheduler.py) is made of: its `_schedule` and `update`
hand the step to `_schedule_fast` and `_update_fast` in fast mode. The running rows are scheduled by
`RunningPass` (running.py), which wakes a sequence in bulk before preempting it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left

from sim.core.request import Request
from sim.engine.kv import Block, KvManager, cdiv
from sim.engine.schedulers.vllm.plan import Seq, StepInfo


class BulkDecoding:
    """Which running sequences are in bulk, how a step counts them, and how one leaves bulk (see the module
    docstring). The rows handled one by one go through `_schedule_running` (running.py) and
    `_emit_rows` (groups.py), as in a scheduler without bulk decoding."""

    # shared with the other parts of `VllmScheduler`
    kv: KvManager
    running: list[Seq]
    block_size: int
    max_model_len: int
    token_budget: int
    fast: bool
    _step: int  # steps scheduled
    _last_end: float  # when the latest applied step ended

    def _init_bulk(self, caching: bool) -> None:
        """No sequence in bulk (once `fast` is set)."""
        self._updated = 0  # steps applied
        self._gaps = SuffixMax()  # step j's end minus step j-1's, by step
        self._busy: dict[Seq, None] = {}  # running sequences handled row by row (insertion-ordered set)
        self._bulk_n = self._bulk_ctx = 0  # sequences in bulk, Σ of their `bulk_ctx`
        self._bulk_max: list[
            tuple[int, int, int, Seq]
        ] = []  # heap of (-bulk_ctx, since, order, seq), pruned lazily
        self._events: list[tuple[int, int, int, Seq]] = []  # (step it needs its own row, order, since, seq)
        # Without prefix caching a sequence in bulk opens its new blocks lazily: the blocks the sequences of
        # phase p open at the steps j = p (mod block size) are taken from the pool at those steps into
        # `_lent`, and handed to each sequence's block table when it is brought up to date (`_wake`).
        self._lazy = self.fast and not caching
        self._phases: list[dict[Seq, None]] = [{} for _ in range(self.block_size)] if self._lazy else []
        self._lent: list[Block] = []
        self._crossed = 0  # the latest step whose new blocks were lent
        self._finishes: list[tuple[int, int, int, Seq]] = []  # (step of its last token, order, since, seq)

    # ---- scheduling ----------------------------------------------------------------------------------
    def _schedule_fast(self, info: StepInfo, threshold: int) -> int:
        """The running rows, those in bulk counted only: the rows handled one by one are scheduled as
        `_schedule_running` would, in running order, the bulk rows each taking one token of the budget."""
        step = self._step + 1
        self._crossed = step - 1
        busy, events = self._busy, self._events
        due = []  # in bulk, reaching the length limit (with prefix caching, or their next block)
        while events and events[0][0] <= step:
            _, _, since, seq = heapq.heappop(events)
            if seq.bulk_since == since:
                due.append(seq)
        need = self._bulk_n
        for seq in busy:
            need += seq.num_tokens - seq.num_computed
        if need >= self.token_budget:  # the budget may bind: every row one by one, in running order
            for seq in self.running:
                if seq.bulk_since >= 0:
                    self._wake(seq)
                    busy[seq] = None
            rows = self.running
        else:
            for seq in due:  # one by one from this step on (rows of their own after the lending)
                self._wake(seq)
            if self._lazy:
                self._lend_blocks(step)
            for seq in due:
                busy[seq] = None
            rows = sorted(busy, key=_order) if len(busy) > 1 else list(busy)
        budget = self._schedule_running(info, rows, self.token_budget, threshold)
        n = self._bulk_n
        if n:
            heap = self._bulk_max
            while heap[0][3].bulk_since != heap[0][1]:
                heapq.heappop(heap)
            info.bulk, info.bulk_ctx, info.bulk_max = n, self._bulk_ctx + n * step, step - heap[0][0]
            info.decode += n
            self.kv.filled(n)
            budget -= n
        info.step, info.sched = step, self
        return budget

    def _lend_blocks(self, step: int) -> None:
        """The new blocks the sequences in bulk open at `step`, taken from the pool when no allocation of this
        step can fail (so none preempts, and without prefix caching which block goes where changes no count);
        else those sequences get rows of their own."""
        members = self._phases[step % self.block_size]
        if members:
            kv = self.kv
            bound = len(members)  # most blocks the step can take: one each, and every row's whole length
            bs, cap = self.block_size, self.max_model_len
            for seq in self._busy:
                bound += cdiv(min(seq.num_tokens, cap), bs) - len(seq.kv_blocks or ())
            if bound > kv.num_free:
                for seq in list(members):
                    self._wake(seq)
                    self._busy[seq] = None
            else:
                self._lent += kv.lend(len(members))
        self._crossed = step

    def _bulk_until(self, seq: Seq) -> int:
        """Queue the step a sequence in bulk next needs a row of its own or, if that comes first, the step of
        its last token; return the last step it decodes in bulk. Without prefix caching the new blocks it
        opens on the way do not need a row (`_lend_blocks`); with it, the first does."""
        since = seq.bulk_since
        # at step j it decodes on bulk_ctx + j tokens, within its room and under the length limit
        room = self.max_model_len - 1 if self._lazy else min(seq.kv_room, self.max_model_len - 1)
        last = room - 1 - seq.bulk_ctx
        finish = since + seq.out_len - seq.num_generated
        if finish <= last:
            heapq.heappush(self._finishes, (finish, seq.order, since, seq))
        else:
            heapq.heappush(self._events, (last + 1, seq.order, since, seq))
        return last

    # ---- into and out of bulk ------------------------------------------------------------------------
    def _wake(self, seq: Seq) -> None:
        """Bring a sequence in bulk up to date (as after the latest applied step, with the blocks lent to it
        up to `_crossed`) and take it out of bulk."""
        since = seq.bulk_since
        count = self._updated - since
        if count:
            seq.num_computed += count
            seq.kv_slots = seq.num_computed
            seq.num_tokens += count
            seq.num_generated += count
            req = seq.req
            req.num_computed = seq.num_computed
            req.emit_run(count, self._last_end, self._gaps.since(since + 1))
        if seq.bulk_phase >= 0:
            self._phases[seq.bulk_phase].pop(seq, None)
            seq.bulk_phase = -1
            blocks = seq.kv_blocks
            assert blocks is not None
            more = cdiv(seq.bulk_ctx + self._crossed + 1, self.block_size) - len(blocks)
            if more > 0:
                lent = self._lent
                assert len(lent) >= more, "blocks lent to sequences in bulk went missing"
                blocks += lent[-more:]
                del lent[-more:]
                room = len(blocks) * self.block_size
                seq.kv_room = room if room <= self.max_model_len else self.max_model_len
        seq.bulk_since = -1
        self._bulk_n -= 1
        self._bulk_ctx -= seq.bulk_ctx

    def _to_bulk(self, seq: Seq) -> bool:
        """After its update: put a one-sequence request's decoding sequence in bulk while it can stay there
        for at least one step (True), with the step it needs its own row again and, if first, the step of
        its last token."""
        if seq.req.n != 1:
            return False
        step = self._updated
        ctx = seq.num_computed - step - 1
        if min(seq.kv_room, self.max_model_len - 1) - 1 - ctx <= step:  # a row of its own next step
            return False
        seq.bulk_since, seq.bulk_ctx = step, ctx
        self._bulk_n += 1
        self._bulk_ctx += ctx
        heapq.heappush(self._bulk_max, (-ctx, step, seq.order, seq))
        if self._lazy:
            seq.bulk_phase = -ctx % self.block_size
            self._phases[seq.bulk_phase][seq] = None
        self._bulk_until(seq)
        return True

    # ---- applying a step -----------------------------------------------------------------------------
    def _update_fast(self, info: StepInfo, now: float) -> list[Request]:
        """`update` in fast mode: the rows handled one by one emit as there, the bulk ones only when they
        finish; sequences that can decode alone go into bulk."""
        step = self._updated = self._step
        self._gaps.append(step, now - self._last_end)
        self._last_end = now
        done_seqs = self._emit_rows(info.emit, now)
        by_row = len(done_seqs)
        self._finish_bulk(step, done_seqs)
        if by_row and len(done_seqs) > by_row:
            done_seqs.sort(key=_order)
        busy = self._busy
        for seq in info.emit:
            if seq.num_generated < seq.out_len and self._to_bulk(seq):
                del busy[seq]
        finished = self._close_done(done_seqs) if done_seqs else []
        if step % GAPS_KEPT == 0:
            self._trim_gaps()
        return finished

    def _finish_bulk(self, step: int, done: list[Seq]) -> None:
        """Bring the sequences in bulk whose last token is step `step`'s (applied) up to date, onto `done`."""
        finishes = self._finishes
        while finishes and finishes[0][0] <= step:
            _, _, since, seq = heapq.heappop(finishes)
            if seq.bulk_since == since:
                self._wake(seq)
                done.append(seq)

    def _close_done(self, done: list[Seq]) -> list[Request]:
        """Take the finished sequences `done` out, freeing their blocks; the requests they finish."""
        finished: list[Request] = []
        running, busy = self.running, self._busy
        for seq in done:
            running.remove(seq)
            busy.pop(seq, None)
            self.kv.free(seq)
            if self._close(seq):
                finished.append(seq.req)
        return finished

    def _trim_gaps(self) -> None:
        """Drop the step gaps no sequence in bulk can need, and the stale entries of the bulk heap."""
        self._bulk_max = [e for e in self._bulk_max if e[3].bulk_since == e[1]]
        heapq.heapify(self._bulk_max)
        oldest = min((s.bulk_since for s in self.running if s.bulk_since >= 0), default=self._updated)
        self._gaps.drop_before(oldest + 1)


class SuffixMax:
    """The largest of the values appended at steps `first` up to the latest, for any `first`: a monotonic
    stack (each entry larger than every later one), so an append costs O(1) amortised and a query a bisection,
    where `max` over a slice copies the whole window."""

    __slots__ = ("_steps", "_values")

    def __init__(self) -> None:
        self._steps: list[int] = []  # rising
        self._values: list[float] = []  # falling: the largest value from each step on

    def append(self, step: int, value: float) -> None:
        """The value of `step`, later than every step appended before."""
        steps, values = self._steps, self._values
        while values and values[-1] <= value:
            values.pop()
            steps.pop()
        steps.append(step)
        values.append(value)

    def since(self, first: int) -> float:
        """The largest value appended at `first` or later (at least one must be)."""
        return self._values[bisect_left(self._steps, first)]

    def drop_before(self, first: int) -> None:
        """Forget the values of the steps before `first` (no query will reach back to them)."""
        k = bisect_left(self._steps, first)
        if k:
            del self._steps[:k]
            del self._values[:k]


def _order(seq: Seq) -> int:
    return seq.order


GAPS_KEPT = 4096  # steps between two drops of the step gaps no sequence in bulk needs

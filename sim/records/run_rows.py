"""A chunk's runs of quiet steps, kept as the engine hands them over and made into rows only when the chunk is
handed on (`RunRows`): a run costs one entry while it is recorded, and its rows come out of a few array
operations over the whole chunk."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from sim.core.step import QuietSteps
from sim.records.columns import STEP_STORED_INTS, WAITING_INDEX
from sim.records.int_rows import IntRows

BATCH, DECODE, KV_USED, KV_ALLOCATED = (
    STEP_STORED_INTS.index(c) for c in ("batch_size", "decode_tokens", "kv_used", "kv_allocated")
)
RUN_FIELDS = ("first", "count", "rows", "used", "used_step", "allocated", "waiting")
RUN_WIDTH = len(RUN_FIELDS)


class RunRows:
    """The runs of quiet steps (`QuietSteps`) in one chunk of step rows, between the rows `Recorder.step`
    writes one at a time (`IntRows`). Run k's steps are the chunk's rows `first` to `first + count - 1`,
    each a decode-only step of `rows` rows with KV used `used + j · used_step` of `allocated` slots (plus
    those its steps allocate, `grown`) and `waiting` requests after it, except the rows `tail_rows` names,
    with `tail_waiting`'s. A run is kept as its `RUN_FIELDS`, one run after another in `entries`."""

    def __init__(self) -> None:
        self.entries: list[int] = []
        self.grown: list[tuple[int, Sequence[int], int]] = []  # (run, blocks each step allocates, block)
        self.tail_rows: list[int] = []
        self.tail_waiting: list[int] = []
        self.rows = 0  # rows in runs

    def add(self, first: int, count: int, quiet: QuietSteps, waiting: int, tail: list[int]) -> None:
        """The first `count` steps of `quiet` as the chunk's rows from `first` on, the last `len(tail)` of
        them with the waiting `tail` gives."""
        if quiet.grow:
            self.grown.append((len(self.entries) // RUN_WIDTH, quiet.grow, quiet.block))
        self.entries.extend((first, count, quiet.rows, quiet.used, quiet.used_step, quiet.allocated, waiting))
        if tail:
            after = first + count - len(tail)
            self.tail_rows.extend(range(after, after + len(tail)))
            self.tail_waiting.extend(tail)
        self.rows += count

    def plain_before(self, row: int) -> int | None:
        """How many rows `Recorder.step` wrote before the chunk's row `row`; None when a run holds `row`."""
        firsts, counts = self.entries[0::RUN_WIDTH], self.entries[1::RUN_WIDTH]
        k = bisect_right(firsts, row) - 1
        if k >= 0 and row < firsts[k] + counts[k]:
            return None
        return row - sum(counts[: k + 1])

    def waiting_at(self, row: int) -> int:
        """The waiting after the step in the chunk's row `row`, which a run holds."""
        if self.tail_rows:
            at = bisect_right(self.tail_rows, row) - 1
            if at >= 0 and self.tail_rows[at] == row:
                return self.tail_waiting[at]
        return self.entries[RUN_WIDTH - 1 :: RUN_WIDTH][bisect_right(self.entries[0::RUN_WIDTH], row) - 1]

    def columns(self, plain: IntRows, n: int) -> np.ndarray:
        """The chunk's `n` rows as a (columns, rows) int64 array: the runs' rows among `plain`'s."""
        if not self.entries:
            return plain.columns()
        out = np.zeros((plain.width, n), np.int64)  # prefill tokens and preempted are 0 in a run
        first, counts, rows, used, used_step, allocated, waiting = (
            np.array(self.entries, np.int64).reshape(-1, RUN_WIDTH).T
        )
        offset = np.repeat(np.cumsum(counts) - counts, counts)
        j = np.arange(self.rows, dtype=np.int64) - offset  # each row's step within its run
        at = np.repeat(first, counts) + j
        mask = np.ones(n, bool)
        mask[at] = False
        out[:, mask] = plain.columns()
        rows_at = np.repeat(rows, counts)
        out[BATCH, at] = rows_at
        out[DECODE, at] = rows_at
        out[KV_USED, at] = np.repeat(used, counts) + j * np.repeat(used_step, counts)
        out[KV_ALLOCATED, at] = np.repeat(allocated, counts)
        if self.grown:
            self._grow(out, at, j, counts)
        out[WAITING_INDEX, at] = np.repeat(waiting, counts)
        if self.tail_rows:
            out[WAITING_INDEX, self.tail_rows] = self.tail_waiting
        return out

    def _grow(self, out: np.ndarray, at: np.ndarray, j: np.ndarray, counts: np.ndarray) -> None:
        """Add to the growing runs' rows the slots their steps allocate (`QuietSteps.grow`): at step j of a
        run with `grow` of period P, block · ((j // P) · Σgrow + Σgrow[: j mod P + 1])."""
        sums: list[int] = []  # each growing run's running sums of `grow`, one after another
        growing, base, period, cycle, blocks = [], [], [], [], []
        for k, grow, block in self.grown:
            growing.append(k)
            base.append(len(sums))
            sums.extend(accumulate(grow))
            period.append(len(grow))
            cycle.append(sums[-1])
            blocks.append(block)
        chosen = np.zeros(len(counts), bool)
        chosen[growing] = True
        rows = np.repeat(chosen, counts)
        jj, per = j[rows], counts[growing]
        p = np.repeat(np.array(period, np.int64), per)
        within = np.array(sums, np.int64)[np.repeat(np.array(base, np.int64), per) + jj % p]
        cycles = np.repeat(np.array(cycle, np.int64), per) * (jj // p)
        out[KV_ALLOCATED, at[rows]] += np.repeat(np.array(blocks, np.int64), per) * (cycles + within)

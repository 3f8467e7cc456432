"""A chunk's runs of quiet steps, kept as the engine hands them over and made into rows only when the chunk is
handed on (`RunRows`): a run costs one entry while it is recorded, and its rows come out of a few array
operations over the whole chunk."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import numpy as np

from sim.core.step import QuietSteps
from sim.records.columns import STEP_STORED_INTS, WAITING_INDEX
from sim.records.int_rows import IntRows

BATCH, DECODE, KV_USED, KV_ALLOCATED = (
    STEP_STORED_INTS.index(c) for c in ("batch_size", "decode_tokens", "kv_used", "kv_allocated")
)


class RunRows:
    """The runs of quiet steps (`QuietSteps`) in one chunk of step rows, between the rows `Recorder.step`
    writes one at a time (`IntRows`). Run k's steps are the chunk's rows `firsts[k]` to
    `firsts[k] + counts[k] - 1`, each a decode-only step of `QuietSteps` with `waiting` requests after it,
    except the rows `tail_rows` names, with `tail_waiting`'s."""

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.counts: list[int] = []
        self.runs: list[QuietSteps] = []
        self.waiting: list[int] = []
        self.tail_rows: list[int] = []
        self.tail_waiting: list[int] = []
        self.rows = 0  # rows in runs

    def add(self, first: int, count: int, quiet: QuietSteps, waiting: int, tail: list[int]) -> None:
        """The first `count` steps of `quiet` as the chunk's rows from `first` on, the last `len(tail)` of
        them with the waiting `tail` gives."""
        self.firsts.append(first)
        self.counts.append(count)
        self.runs.append(quiet)
        self.waiting.append(waiting)
        if tail:
            after = first + count - len(tail)
            self.tail_rows.extend(range(after, after + len(tail)))
            self.tail_waiting.extend(tail)
        self.rows += count

    def plain_before(self, row: int) -> int | None:
        """How many rows `Recorder.step` wrote before the chunk's row `row`; None when a run holds `row`."""
        k = bisect_right(self.firsts, row) - 1
        if k >= 0 and row < self.firsts[k] + self.counts[k]:
            return None
        return row - sum(self.counts[: k + 1])

    def waiting_at(self, row: int) -> int:
        """The waiting after the step in the chunk's row `row`, which a run holds."""
        if self.tail_rows:
            at = bisect_right(self.tail_rows, row) - 1
            if at >= 0 and self.tail_rows[at] == row:
                return self.tail_waiting[at]
        return self.waiting[bisect_right(self.firsts, row) - 1]

    def columns(self, plain: IntRows, n: int) -> np.ndarray:
        """The chunk's `n` rows as a (columns, rows) int64 array: the runs' rows among `plain`'s."""
        if not self.runs:
            return plain.columns()
        out = np.zeros((plain.width, n), np.int64)  # prefill tokens and preempted are 0 in a run
        counts = np.array(self.counts, np.int64)
        offset = np.repeat(np.cumsum(counts) - counts, counts)
        j = np.arange(self.rows, dtype=np.int64) - offset  # each row's step within its run
        at = np.repeat(np.array(self.firsts, np.int64), counts) + j
        mask = np.ones(n, bool)
        mask[at] = False
        out[:, mask] = plain.columns()
        _, rows, _, _, used, used_step, allocated, _, grows, blocks = zip(*self.runs, strict=True)
        rows_at = np.repeat(np.array(rows, np.int64), counts)
        out[BATCH, at] = rows_at
        out[DECODE, at] = rows_at
        out[KV_USED, at] = np.repeat(np.array(used, np.int64), counts) + j * np.repeat(
            np.array(used_step, np.int64), counts
        )
        out[KV_ALLOCATED, at] = np.repeat(np.array(allocated, np.int64), counts)
        growing = [k for k, grow in enumerate(grows) if grow]
        if growing:
            self._grow(out, at, j, growing, grows, blocks)
        out[WAITING_INDEX, at] = np.repeat(np.array(self.waiting, np.int64), counts)
        if self.tail_rows:
            out[WAITING_INDEX, self.tail_rows] = self.tail_waiting
        return out

    def _grow(
        self,
        out: np.ndarray,
        at: np.ndarray,
        j: np.ndarray,
        growing: list[int],
        grows: tuple[list[int], ...],
        blocks: tuple[int, ...],
    ) -> None:
        """Add to the growing runs' rows the slots their steps allocate (`QuietSteps.allocated_at`): at
        step j of a run with `grow` of period P, block · ((j // P) · Σgrow + Σgrow[: j mod P + 1])."""
        sums: list[int] = []  # each growing run's running sums of `grow`, one after another
        base, period, cycle = [], [], []
        for k in growing:
            grow = grows[k]
            base.append(len(sums))
            sums.extend(accumulate(grow))
            period.append(len(grow))
            cycle.append(sums[-1])
        counts = np.array(self.counts, np.int64)
        chosen = np.zeros(len(counts), bool)
        chosen[growing] = True
        rows = np.repeat(chosen, counts)
        jj, per = j[rows], counts[growing]
        block = np.repeat(np.array([blocks[k] for k in growing], np.int64), per)
        p = np.repeat(np.array(period, np.int64), per)
        within = np.array(sums, np.int64)[np.repeat(np.array(base, np.int64), per) + jj % p]
        cycles = np.repeat(np.array(cycle, np.int64), per) * (jj // p)
        out[KV_ALLOCATED, at[rows]] += block * (cycles + within)

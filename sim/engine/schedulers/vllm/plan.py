"""The rows of a `vllm` step: a sequence's state, one step's scheduling decisions, and its plan."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan, StepTotals
from sim.engine.kv import Block


@dataclass(slots=True, eq=False)
class Seq:
    """One sequence of a request (a request with `n > 1` has `n`); the `kv_*` fields are its block table."""

    sid: int
    req: Request
    child: int
    out_len: int
    num_tokens: int = 0  # prompt plus generated tokens, kept in step with `num_generated`
    num_computed: int = 0
    num_generated: int = 0
    preempted: bool = False  # waiting after a preemption (resumes rather than starts)
    external: int = 0  # tokens whose KV another replica computed, loaded at admission (`add_transferred`)
    block_size: int = 16
    kv_blocks: list[Block] | None = None
    kv_slots: int = 0
    kv_cached: int = 0
    kv_room: int = -1
    # --- bulk decoding (`VllmScheduler(fast=True)`) ---
    order: int = 0  # position key in the running list (admissions count up)
    bulk_since: int = -1  # the step after whose update its fields were last exact; -1: handled row by row
    bulk_ctx: int = 0  # its context at step j is bulk_ctx + j
    bulk_phase: int = (
        -1
    )  # without prefix caching: it opens a new block at the steps j = bulk_phase (mod size)

    def block_hash(self, j: int) -> Hashable:
        """Content key of block j: the hash chain is shared by a prefix group, then by the prompt's copies
        (every request of a prompt pool's prompt)."""
        req = self.req
        end = (j + 1) * self.block_size
        if req.prefix_group >= 0 and end <= req.prefix_len and end <= req.prompt_len:
            return ("g", req.prefix_group, j)
        if end <= req.prompt_len:
            return ("p", req.id, j) if req.prompt_id < 0 else ("q", req.prompt_id, j)
        return ("s", req.id, self.child, j)


class StepInfo:
    """What one `schedule` call decided (the plan's payload): rows as parallel lists, in scheduling order."""

    __slots__ = ("seqs", "counts", "contexts", "emit", "new", "resumed", "preempted", "decode", "bulk",
                 "bulk_ctx", "bulk_max", "step", "sched")  # fmt: skip

    def __init__(self) -> None:
        self.seqs: list[Seq] = []
        self.counts: list[int] = []  # new tokens per row
        self.contexts: list[int] = []  # computed tokens per row before this step
        self.emit: list[Seq] = []  # rows that reach their length: each emits a token
        self.new: list[Seq] = []
        self.resumed: list[Seq] = []
        self.preempted: list[Seq] = []
        self.decode = 0  # rows that decode one token
        # rows advanced in bulk (fast mode), not in the lists above: count, Σ and max of their contexts
        self.bulk = self.bulk_ctx = self.bulk_max = 0
        self.step = 0
        self.sched: _Scheduler | None = None  # set when rows advance in bulk

    @property
    def rows(self) -> list[tuple[Seq, int]]:
        return list(zip(self.seqs, self.counts, strict=True))


class _Scheduler(Protocol):
    """What a plan reads of its scheduler: the running sequences (those advanced in bulk among them)."""

    running: list[Seq]


class VllmPlan(StepPlan):
    """A step plan with its rows' integer sums (`totals`, for `CostModel.step_time_totals`); the row arrays
    are built from the step's lists on first access."""

    __slots__ = ("totals", "_arrays")

    def __init__(self, info: StepInfo, totals: StepTotals, kv: KvUsage) -> None:
        self.totals = totals
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.num_decode_tokens = info.decode
        self.num_prefill_tokens = totals.tokens - info.decode
        self.kv = kv
        self.payload = info
        self.preempted = len(info.preempted)
        self.batch_size = totals.rows

    def _rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Built before the step is applied (`update`): rows advanced in bulk are read from the scheduler."""
        if self._arrays is None:
            info: StepInfo = self.payload
            counts, contexts = info.counts, info.contexts
            if info.bulk:
                assert info.sched is not None
                rows = sorted(
                    [(s.order, 1, s.bulk_ctx + info.step) for s in info.sched.running if s.bulk_since >= 0]
                    + [(s.order, c, q) for s, c, q in zip(info.seqs, counts, contexts, strict=True)]
                )
                counts, contexts = [c for _, c, _ in rows], [q for _, _, q in rows]
            self._arrays = np.array(counts, dtype=np.int64), np.array(contexts, dtype=np.int64)
        return self._arrays

    @property  # type: ignore[override]
    def new_tokens(self) -> np.ndarray:
        return self._rows()[0]

    @property  # type: ignore[override]
    def context(self) -> np.ndarray:
        return self._rows()[1]

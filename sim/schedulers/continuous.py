"""Iteration-level (continuous) batching, Orca style, with reservation-based KV memory.

Requests join and leave at every step, up to `max_num_seqs`. At admission a request reserves KV slots for
`n × (prompt + max_tokens)` tokens (no paging, no sharing), so `max_tokens` and `n` are memory reservations.
Newcomers' whole-prompt prefills share a step with the others' decodes.

Every running request emits one token per step, so its finishing step is known at admission: a heap keyed by
that step replaces any per-request work in the steady decode loop. The cost model's inputs are kept as running
integer sums (Σn, Σn², Σcontext, Σn·context), updated only when a request joins or leaves and by one add per
step, so a step costs O(admitted + finished); the row arrays are built only when the cost model asks for them
(a sliding window may be reached).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sim.request import Request
from sim.schedulers.base import KvUsage, StepPlan
from sim.schedulers.registry import KvBudget, register
from sim.schedulers.reservation import ReservationQueue


class ContinuousConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once.")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Prefill tokens admitted per step (a single longer prompt still runs alone)."
    )


class ContinuousPlan(StepPlan):
    """A step plan that carries its rows' integer sums for `CostModel.step_time_totals`.

    The row arrays (`new_tokens`, `context`) are built on first access, from the scheduler's state at
    `schedule` time: they can be read until the step is applied (`update`), not after.
    """

    __slots__ = ("totals", "_build", "_rows")

    def __init__(
        self,
        totals: tuple[int, ...],
        build: Callable[[list[Request]], tuple[np.ndarray, np.ndarray]],
        admitted: list[Request],
        prefill: int,
        decode: int,
        kv: KvUsage,
    ) -> None:
        self.totals = totals
        self._build: Callable[[list[Request]], tuple[np.ndarray, np.ndarray]] | None = build
        self._rows: tuple[np.ndarray, np.ndarray] | None = None
        self.num_prefill_tokens = prefill
        self.num_decode_tokens = decode
        self.kv = kv
        self.payload = admitted
        self.preempted = 0
        self.batch_size = totals[0]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._rows is None:
            if self._build is None:
                raise RuntimeError(
                    "a continuous plan's row arrays are readable only until its step is applied"
                )
            self._rows = self._build(self.payload)
        return self._rows

    @property  # type: ignore[override]
    def new_tokens(self) -> np.ndarray:
        return self._arrays()[0]

    @property  # type: ignore[override]
    def context(self) -> np.ndarray:
        return self._arrays()[1]

    def applied(self) -> None:
        self._build = None


class ContinuousScheduler(ReservationQueue):
    def __init__(self, config: ContinuousConfig, memory: KvBudget):
        super().__init__(memory)
        self.cfg = config
        # Admitted in earlier steps and decoding, in admission order -> the step of its first token.
        # At step k a running request's context is prompt_len + k - first_step.
        self.running: dict[Request, int] = {}
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.step = 0  # steps applied so far
        self.pending: list[Request] = []  # admitted into the step in progress
        self.last_end = math.nan  # end time of the latest applied step
        # Sums over running requests' decode rows (c = n new tokens on q = context), kept up to date.
        self._seqs = 0  # Σ n
        self._seqs_sq = 0  # Σ n²
        self._ones = 0  # rows with n == 1
        self._ctx = 0  # Σ context
        self._seqs_ctx = 0  # Σ n · context
        self._end_bound = 0  # ≥ max(prompt_len + n - first_step) over running: max(q + c) - step

    def wake_at(self, now: float) -> float | None:
        return None

    def schedule(self, now: float) -> StepPlan | None:
        admitted: list[Request] = []
        running, waiting, kv = self.running, self.waiting, self.kv
        prefill = prefill_sq = prefill_ones = longest = 0
        room = self.cfg.max_num_seqs - len(running)
        if waiting and room > 0:
            budget = self.cfg.max_num_batched_tokens
            while waiting and len(admitted) < room:
                head = waiting[0]
                p = head.prompt_len
                if admitted and p > budget:
                    break
                if not kv.reserve(kv.need(head)):
                    break  # head-of-line blocking: FCFS, no overtaking
                waiting.popleft()
                head.scheduled_at = now
                admitted.append(head)
                budget -= p
                prefill += p
                prefill_sq += p * p
                prefill_ones += p == 1
                if p > longest:
                    longest = p
        elif not running:
            return None
        if not running:
            if not admitted:
                return None
            max_end = longest
        else:
            max_end = self._end_bound + self.step
            if longest > max_end:
                max_end = longest
        seqs = self._seqs
        totals = (
            len(running) + len(admitted),
            seqs + prefill,
            self._ones + prefill_ones,
            self._seqs_ctx,
            self._seqs_sq + prefill_sq,
            self._ctx,
            max_end,
        )
        self.pending = admitted
        return ContinuousPlan(
            totals, self._rows, admitted, prefill, seqs, KvUsage(kv.used(), kv.reserved, kv.capacity)
        )

    def _rows(self, admitted: list[Request]) -> tuple[np.ndarray, np.ndarray]:
        """The step's row arrays: running requests' decodes, then the admitted prompts."""
        k, count = self.step, len(self.running) + len(admitted)
        new_tokens = np.fromiter(
            itertools.chain((r.n for r in self.running), (r.prompt_len for r in admitted)), np.int64, count
        )
        context = np.fromiter(
            itertools.chain((r.prompt_len + k - f for r, f in self.running.items()), (0 for _ in admitted)),
            np.int64,
            count,
        )
        return new_tokens, context

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        admitted: list[Request] = plan.payload
        if isinstance(plan, ContinuousPlan):
            plan._build = None  # applied: its row arrays can no longer be built
        k = self.step
        self.last_end = now
        running, kv = self.running, self.kv
        # Decodes: one token per running sequence; every context grows by one.
        self._ctx += len(running)
        self._seqs_ctx += self._seqs
        kv.store(self._seqs)
        if not admitted and (not self.finish_heap or self.finish_heap[0][0] > k):
            self.pending = admitted
            self.step = k + 1
            return []  # a decode-only step where nobody finishes
        self.pending = []
        # Prefills: prompt computed, first token emitted now.
        for req in admitted:
            req.emit(now)
            p, n = req.prompt_len, req.n
            req.num_computed = p
            running[req] = k
            kv.store(n * (p + 1))
            heapq.heappush(self.finish_heap, (k + req.output_len - 1, req.id, req))
            self._add_row(n, p + 1)
            self._end_bound = max(self._end_bound, p + n - k)
        finished: list[Request] = []
        heap = self.finish_heap
        while heap and heap[0][0] <= k:
            req = heapq.heappop(heap)[2]
            first = running.pop(req)
            # It emitted one token per step from `first` to `k`: its last one now.
            req.num_generated = k - first + 1
            req.num_computed = req.prompt_len + req.num_generated - 1
            req.last_token_at = req.finished_at = now
            self._add_row(req.n, req.prompt_len + k + 1 - first, -1)
            kv.release(req)
            finished.append(req)
        if not running:
            self._end_bound = 0
        self.step = k + 1
        return finished

    def _add_row(self, n: int, ctx: int, sign: int = 1) -> None:
        """Add (sign 1) or remove (sign -1) a decode row of `n` sequences on `ctx` cached tokens."""
        self._seqs += sign * n
        self._seqs_sq += sign * n * n
        self._ones += sign * (n == 1)
        self._ctx += sign * ctx
        self._seqs_ctx += sign * n * ctx

    def in_flight(self) -> list[Request]:
        last = self.step - 1
        for req, first in self.running.items():
            # Still running, so it emitted one token in every step from `first` to the last one.
            req.num_generated = last - first + 1
            req.num_computed = req.prompt_len + req.num_generated - 1
            req.last_token_at = self.last_end
        return [*self.running, *self.pending, *self.waiting]


def build(config: ContinuousConfig, memory: KvBudget) -> ContinuousScheduler:
    return ContinuousScheduler(config, memory)


register("continuous", ContinuousConfig, build)

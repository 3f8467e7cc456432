"""The decode side of disaggregated serving: requests arrive with their prompt's KV already computed
(transferred from a prefill replica) and their first token emitted; the decode replica only decodes.

`PagedDecode`: the group's own policy (vLLM's rules: paged blocks allocated as the sequence grows, the same
token budget and `max_num_seqs`, recompute preemption when blocks run out) running decode-only work, as
vLLM's decode instances do; the transferred prompt KV is loaded into blocks at admission
(`VllmScheduler.add_transferred`). The decode group of a policy without paged KV (static, continuous) runs
`DecodeScheduler`, a reservation queue:

A request is admitted, first come first served, when its whole KV fits in free blocks
(n x ceil(min(prompt + max_tokens, max_model_len) / block_size), reserved until it finishes, so it is never
preempted; its output stops at max_model_len, as vLLM's does) and
fewer than `max_num_seqs` sequences run. Every running sequence decodes one token per step: the first decode
of a P-token prompt is 1 new token on P cached ones (see `StepPlan`).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import numpy as np

from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DecodePlan(StepPlan):
    """A decode-only step with its rows' integer sums (`CostModel.step_time_totals`); arrays on demand."""

    __slots__ = ("totals", "_rows")

    def __init__(
        self, totals: tuple[int, ...], rows: list[tuple[int, int]], admitted: list[Request], kv: KvUsage
    ):
        self.totals = totals
        self._rows = rows  # (n, context) per running request
        self.num_prefill_tokens = 0
        self.num_decode_tokens = totals[0]
        self.kv = kv
        self.payload = admitted
        self.preempted = 0
        self.batch_size = totals[0]

    @property  # type: ignore[override]
    def new_tokens(self) -> np.ndarray:
        return np.ones(self.totals[0], np.int64)

    @property  # type: ignore[override]
    def context(self) -> np.ndarray:
        return np.repeat(
            np.array([c for _, c in self._rows], np.int64), np.array([n for n, _ in self._rows], np.int64)
        )


class PagedDecode:
    """A paged policy's scheduler (`VllmScheduler`) as a decode replica: arrivals are transferred requests,
    and the first admission of each is recorded (`admitted_at`, the end of its wait for blocks)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.admitted_at: dict[int, float] = {}  # request id -> when it started decoding

    @property
    def num_waiting(self) -> int:
        return int(self.inner.num_waiting)

    def add(self, request: Request, now: float) -> bool:
        return bool(self.inner.add_transferred(request, now))

    def wake_at(self, now: float) -> float | None:
        return self.inner.wake_at(now)  # type: ignore[no-any-return]

    def schedule(self, now: float) -> StepPlan | None:
        plan = self.inner.schedule(now)
        if plan is not None:
            for seq in plan.payload.new:
                self.admitted_at.setdefault(seq.req.id, now)
        return plan  # type: ignore[no-any-return]

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        return self.inner.update(plan, now)  # type: ignore[no-any-return]

    def in_flight(self) -> list[Request]:
        return self.inner.in_flight()  # type: ignore[no-any-return]


def decode_scheduler(inner: Any, budget: KvBudget, max_num_seqs: int) -> PagedDecode | DecodeScheduler:
    """The decode replica's scheduler: the group's policy when it pages KV (`inner` takes transferred
    requests), else the reservation queue."""
    if hasattr(inner, "add_transferred"):
        return PagedDecode(inner)
    return DecodeScheduler(budget, max_num_seqs)


class DecodeScheduler:
    def __init__(self, budget: KvBudget, max_num_seqs: int) -> None:
        self.block_size = budget.block_size
        self.num_blocks = budget.num_blocks
        self.max_model_len = budget.max_model_len
        self.max_num_seqs = max_num_seqs
        self.free_blocks = budget.num_blocks
        self.waiting: deque[Request] = deque()
        self.running: dict[Request, int] = {}  # request -> step of its first decode
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.step = 0
        self.seqs = 0
        self.admitted_at: dict[int, float] = {}  # request id -> when it started decoding
        self.last_end = float("nan")

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def blocks(self, req: Request) -> int:
        """Blocks for the request's longest possible sequences (prompt + max_tokens, within max_model_len)."""
        return req.n * _cdiv(min(req.prompt_len + req.max_tokens, self.max_model_len), self.block_size)

    def add(self, request: Request, now: float) -> bool:
        if request.prompt_len >= self.max_model_len:
            request.reject_reason = "prompt leaves no room for output within max_model_len"
            return False
        # as vLLM does: the output stops at max_model_len
        request.output_len = min(request.output_len, self.max_model_len - request.prompt_len)
        if self.blocks(request) > self.num_blocks:
            request.reject_reason = "KV reservation exceeds the KV cache"
            return False
        self.waiting.append(request)
        return True

    def wake_at(self, now: float) -> float | None:
        return None

    def _context(self, req: Request, first: int, step: int) -> int:
        """KV tokens cached before `step` for a request whose first decode was at step `first`."""
        return req.prompt_len + req.num_generated - 1 + (step - first)

    def schedule(self, now: float) -> StepPlan | None:
        admitted: list[Request] = []
        waiting, running, k = self.waiting, self.running, self.step
        while waiting:
            head = waiting[0]
            need = self.blocks(head)
            if need > self.free_blocks or (self.seqs + head.n > self.max_num_seqs and running):
                break
            waiting.popleft()
            self.free_blocks -= need
            running[head] = k
            self.seqs += head.n
            self.admitted_at[head.id] = now
            heapq.heappush(self.finish_heap, (k + head.output_len - head.num_generated - 1, head.id, head))
            admitted.append(head)
        if not running:
            return None
        rows = [(r.n, self._context(r, f, k)) for r, f in running.items()]
        seqs = self.seqs
        ctx = sum(n * c for n, c in rows)
        max_end = max(c for _, c in rows) + 1
        used = ctx + seqs
        allocated = (self.num_blocks - self.free_blocks) * self.block_size
        kv = KvUsage(used, allocated, self.num_blocks * self.block_size)
        return DecodePlan((seqs, seqs, seqs, ctx, seqs, ctx, max_end), rows, admitted, kv)

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        k = self.step
        before, self.last_end = self.last_end, now
        for req in plan.payload:  # the first decode gap includes the wait for blocks
            gap = now - req.first_token_at
            if gap > req.itl_max:
                req.itl_max = gap
            if req.n == 1 and not req.last_token_at >= before:  # a wait of more than this step (or the first)
                req.stall(now, True)
        finished: list[Request] = []
        heap = self.finish_heap
        while heap and heap[0][0] <= k:
            req = heapq.heappop(heap)[2]
            first = self.running.pop(req)
            req.num_generated += k - first + 1
            req.num_computed = req.prompt_len + req.num_generated - 1
            req.last_token_at = req.finished_at = now
            self.seqs -= req.n
            self.free_blocks += self.blocks(req)
            finished.append(req)
        self.step = k + 1
        return finished

    def in_flight(self) -> list[Request]:
        last = self.step - 1
        for req, first in self.running.items():
            done = last - first + 1
            if done > 0:
                req.num_generated += done
                req.num_computed = req.prompt_len + req.num_generated - 1
                req.last_token_at = self.last_end
        return [*self.running, *self.waiting]

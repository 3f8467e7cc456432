"""Iteration-level (continuous) batching, Orca style, with reservation-based KV memory.

Requests join and leave at every step, up to `max_num_seqs` sequences. At admission a request reserves KV
slots for `n × (prompt + max_tokens)` tokens (no paging, no sharing), so `max_tokens` and `n` are memory
reservations. Newcomers' whole-prompt prefills share a step with the others' decodes. A request with
`n > 1` runs as `n` sequences, as vLLM v1 fans it out into `n` child requests: each prefills its own copy of
the prompt, holds its own KV and decodes as its own row (see `StepPlan` for what a row is). A request with
more sequences than `max_num_seqs` runs only alone.

Every running request emits one token per step, so its finishing step is known at admission: a heap keyed by
that step replaces any per-request work in the steady decode loop. The cost model's inputs are kept as running
integer sums (Σn and Σn·context over running requests), updated only when a request joins or leaves and by
one add per step, so a step costs O(admitted + finished); the row arrays are built only when the cost model
asks for them (a sliding window may be reached).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from sim.config.policies import ContinuousConfig
from sim.core.request import Request
from sim.core.step import KvUsage, QuietSteps, StepPlan, StepTotals
from sim.cost.memory import KvBudget
from sim.engine.schedulers.registry import register
from sim.engine.schedulers.reservation import ReservationQueue


class ContinuousPlan(StepPlan):
    """A step plan that carries its rows' integer sums for `CostModel.step_time_totals`.

    The row arrays (`new_tokens`, `context`) are built on first access, from the scheduler's state at
    `schedule` time: they can be read until the step is applied (`update`), not after.
    """

    __slots__ = ("totals", "_build", "_rows")

    def __init__(
        self,
        totals: StepTotals,
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
        self.batch_size = totals.rows

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
        # Admitted in earlier steps and decoding, in admission order -> the step of its prefill (`first`).
        # At step k each of its n sequences decodes 1 token on context prompt_len + k - 1 - first.
        self.running: dict[Request, int] = {}
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.step = 0  # steps applied so far
        self.pending: list[Request] = []  # admitted into the step in progress
        self.last_end = math.nan  # end time of the latest applied step
        # Sums over running requests' decode rows (n rows of 1 new token on q cached ones), kept up to date.
        self._seqs = 0  # Σ n: decode rows
        self._seqs_ctx = 0  # Σ n · q
        self._end_bound = 0  # ≥ max(q + 1 - step) = max(prompt_len - first) over running

    def wake_at(self, now: float) -> float | None:
        return None

    def schedule(self, now: float) -> StepPlan | None:
        admitted: list[Request] = []
        running, waiting, kv = self.running, self.waiting, self.kv
        prefill = prefill_rows = prefill_sq = prefill_ones = longest = 0
        room = self.cfg.max_num_seqs - self._seqs
        if waiting and (room > 0 or not running):
            budget = self.cfg.max_num_batched_tokens
            while waiting:
                head = waiting[0]
                p, n = head.prompt_len, head.n
                if n > room and (admitted or running):
                    break
                if admitted and n * p > budget:
                    break
                if not kv.reserve_for(head):
                    break  # head-of-line blocking: FCFS, no overtaking
                waiting.popleft()
                head.scheduled_at = now
                admitted.append(head)
                room -= n
                budget -= n * p
                prefill += n * p
                prefill_rows += n
                prefill_sq += n * p * p
                if p == 1:
                    prefill_ones += n
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
        seqs, seqs_ctx = self._seqs, self._seqs_ctx
        # KV used counts the token states stored once this step is done: every decode's (already in
        # `kv.used()`) and every admitted prompt copy's.
        # (rows, Σc, #(c = 1), Σc·q, Σc², Σq, max(q + c)): decodes have c = 1, prefills q = 0.
        totals = StepTotals(
            seqs + prefill_rows, seqs + prefill, seqs + prefill_ones, seqs_ctx, seqs + prefill_sq, seqs_ctx,
            max_end,
        )  # fmt: skip
        self.pending = admitted
        usage = KvUsage(kv.used() + prefill, kv.reserved, kv.capacity)
        return ContinuousPlan(totals, self._rows, admitted, prefill, seqs, usage)

    def quiet_steps(self) -> QuietSteps | None:
        """The decode-only steps from the next one on in which nobody is admitted (the head of the queue
        cannot be admitted, and nothing that could change that happens before the first finish), up to and
        including the first step where somebody finishes: each is `schedule` and `update` of a step with no
        admission, and the engine may advance them at once (`advance_quiet`). None when the next step admits
        someone."""
        running = self.running
        if not running:
            return None
        kv = self.kv
        if self.waiting:
            head = self.waiting[0]
            room = self.cfg.max_num_seqs - self._seqs
            if head.n <= room and kv.reserved + kv.need(head) <= kv.capacity:
                return None  # the next step admits it
        steps = self.finish_heap[0][0] - self.step + 1  # through the first step where somebody finishes
        rows, first_end = self._seqs, self._end_bound + self.step
        return QuietSteps(steps, rows, self._seqs_ctx, first_end, kv.used(), rows, kv.reserved, kv.capacity)

    def advance_quiet(self, start: float, ends: list[float]) -> list[Request]:
        """Apply the first `len(ends)` of `quiet_steps`'s steps, as `schedule` and `update` of each would
        (the first starting at `start`, step j ending at `ends[j]`); the requests that finished in the last
        one, as `update` returns them."""
        steps = len(ends)
        tokens = steps * self._seqs
        self._seqs_ctx += tokens
        self.kv.store(tokens)
        k = self.step + steps - 1  # the last step applied
        self.step = k + 1
        self.last_end = ends[-1]
        return self._finish(k, self.last_end)

    def _rows(self, admitted: list[Request]) -> tuple[np.ndarray, np.ndarray]:
        """The step's row arrays: running sequences' decodes, then the admitted sequences' prompts."""
        k, running = self.step, self.running
        ns = np.fromiter((r.n for r in running), np.int64, len(running))
        qs = np.fromiter((r.prompt_len + k - 1 - f for r, f in running.items()), np.int64, len(running))
        an = np.fromiter((r.n for r in admitted), np.int64, len(admitted))
        ap = np.fromiter((r.prompt_len for r in admitted), np.int64, len(admitted))
        new_tokens = np.concatenate((np.ones(int(ns.sum()), np.int64), np.repeat(ap, an)))
        context = np.concatenate((np.repeat(qs, ns), np.zeros(int(an.sum()), np.int64)))
        return new_tokens, context

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        admitted: list[Request] = plan.payload
        if isinstance(plan, ContinuousPlan):
            plan._build = None  # applied: its row arrays can no longer be built
        k = self.step
        self.last_end = now
        running, kv = self.running, self.kv
        # Decodes: one token per running sequence; every context grows by one.
        self._seqs_ctx += self._seqs
        kv.store(self._seqs)
        if not admitted and (not self.finish_heap or self.finish_heap[0][0] > k):
            self.pending = admitted
            self.step = k + 1
            return []  # a decode-only step where nobody finishes
        self.pending = []
        # Prefills: prompt computed, first token emitted now; its first decode (next step) is on context p.
        for req in admitted:
            req.emit(now)
            p, n = req.prompt_len, req.n
            req.num_computed = p
            running[req] = k
            kv.store(n * (p + 1))
            heapq.heappush(self.finish_heap, (k + req.output_len - 1, req.id, req))
            self._seqs += n
            self._seqs_ctx += n * p
            if p - k > self._end_bound:
                self._end_bound = p - k
        finished = self._finish(k, now)
        self.step = k + 1
        return finished

    def _finish(self, k: int, now: float) -> list[Request]:
        """Take out the requests whose last token step `k` (applied, ending at `now`) emitted."""
        finished: list[Request] = []
        running, kv, heap = self.running, self.kv, self.finish_heap
        while heap and heap[0][0] <= k:
            req = heapq.heappop(heap)[2]
            first = running.pop(req)
            # It emitted one token per step from `first` to `k`: its last one now.
            req.num_generated = k - first + 1
            req.num_computed = req.prompt_len + req.num_generated - 1
            req.last_token_at = req.finished_at = now
            self._seqs -= req.n
            self._seqs_ctx -= req.n * (req.prompt_len + k - first)  # its context at step k + 1
            kv.release(req)
            finished.append(req)
        if not running:
            self._end_bound = 0
        return finished

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


register("continuous", build)

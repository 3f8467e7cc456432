"""S-LoRA's router: continuous batching of requests of any number of adapters over a unified memory pool.

Followed from the authors' code (S-LoRA/S-LoRA at c1ddf48), `slora/server/router/manager.py`
(`RouterManager._step`, lines 177-253) and `slora/server/router/req_queue.py` (`ReqQueue`):

1. With no running batch, the queue's head requests are admitted (`generate_new_batch`), their adapters
   loaded, and they run a prefill-only step (lines 182-211).
2. With a running batch, it decodes a token per request for `max_wait_tokens` (10, line 84) steps; after
   them, every step first tries to admit a mini-batch: when it does, the mini-batch's adapters are loaded
   and it runs a prefill-only step while the running requests wait, then joins them (lines 213-249).
3. Admission (`req_queue.py` lines 22-86) is FCFS and stops at the first request that does not fit: the
   prompts of a mini-batch take at most `batch_max_tokens`; at most `running_max_req_size` run; and the
   pool must hold, at the peak, every running and admitted request's KV to its end beside the batch's
   adapters. With the requests sorted by remaining output, longest first, the peak is
   max over i of (remaining_i x (i + 1) + Σ_{j ≤ i} length_j), and it must stay below the pool's cells
   less the batch's adapters' (`_can_add_new_req`, lines 39-57). The remaining output is reserved from
   `max_new_tokens`: `max_tokens`, or, as S-LoRA's benchmark sends `max_new_tokens` equal to each
   request's output length with `ignore_eos` (`benchmarks/run_exp.py` lines 59-69), the output itself.
4. A batch holds requests of any number of adapters (no `max_loras` cap); adapters live in the pool
   (slora_pool.py), loaded synchronously before the prefill that needs them (manager.py lines 191-196,
   239-243) and dropped when a decode step finishes a request and no running request uses them, or the
   batch empties (lines 306-339).
5. With `prefetch` (`--prefetch`, off in the artifact's runs), at the 5th and 7th of the decode steps
   (`max_wait_tokens // 2` and `max_wait_tokens - 3`, lines 215-225) the adapters of the queue's head
   (the requests whose prompts fit `batch_max_tokens`, `next_batch`) are loaded on a side stream, as far
   as the pool's free cells go: those loads cost no step time.

A running request's token after a prefill-only step has the whole wait as its gap (`Request.stall`).
S-LoRA serves one sequence per request: a request with `n > 1` is rejected, as is one longer than the pool.
The step's LoRA kernels and load times are costed by `sim/engine/slora.py`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.config.policies import SLoraConfig
from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget
from sim.engine.schedulers.registry import register
from sim.engine.schedulers.slora_pool import AdapterPool

MAX_REQ_TOTAL_LEN = 2048 + 1024  # S-LoRA's --max_req_total_len default (api_server.py line 345)


@dataclass(slots=True)
class SLoraStep:
    prefill: list[Request]  # a mini-batch's prefill-only step ...
    decode: list[Request]  # ... or the running batch's decode step
    loaded: list[int] = field(default_factory=list)  # adapters loaded before it, synchronously


class SLoraScheduler:
    def __init__(self, config: SLoraConfig, memory: KvBudget) -> None:
        self.cfg = config
        cells = memory.num_tokens if config.max_total_token_num is None else config.max_total_token_num
        self.pool = AdapterPool(cells, lambda _a: 0)
        limit = config.batch_max_tokens
        self.batch_max_tokens = max(cells // 6, MAX_REQ_TOTAL_LEN) if limit is None else limit
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.wait_tokens = 0  # decode steps since the latest prefill (`has_wait_tokens`)
        self._last_end = -math.inf

    def serve_adapters(self, adapter_cells: Callable[[int], int]) -> None:
        """The pool cells each adapter takes (set by the run, which knows the model and the adapters)."""
        self.pool.adapter_cells = adapter_cells

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _max_out(self, req: Request) -> int:
        return req.output_len if self.cfg.max_new_tokens == "output" else req.max_tokens

    def add(self, request: Request, now: float) -> bool:
        if request.n > 1:
            request.reject_reason = "slora runs one sequence per request (n > 1)"
        elif request.prompt_len + self._max_out(request) >= self.pool.capacity:
            request.reject_reason = "prompt + max_new_tokens exceeds the pool (max_total_token_num)"
        if request.reject_reason is not None:
            return False
        self.waiting.append(request)
        return True

    def wake_at(self, now: float) -> float | None:
        return None

    # --- admission (req_queue.py) ---------------------------------------------------------------------

    def _admit(self) -> list[Request]:
        """`generate_new_batch`: the queue's head requests that fit, FCFS, up to the first that does not."""
        limit = self.cfg.running_max_req_size
        if len(self.running) >= limit or not self.waiting:
            return []
        lengths = [r.prompt_len + r.num_generated for r in self.running]
        left = [self._max_out(r) - r.num_generated - 1 for r in self.running]
        adapters = {r.adapter for r in self.running if r.adapter >= 0}
        adapter_cells = sum(self.pool.adapter_cells(a) for a in adapters)
        batch: list[Request] = []
        tokens = 0
        for req in self.waiting:
            lengths.append(req.prompt_len + 1)
            left.append(self._max_out(req) - 1)
            if req.adapter >= 0 and req.adapter not in adapters:
                adapters.add(req.adapter)
                adapter_cells += self.pool.adapter_cells(req.adapter)
            remaining = np.asarray(left)
            order = np.argsort(-remaining, kind="stable")
            peak = remaining[order] * np.arange(1, len(left) + 1) + np.cumsum(np.asarray(lengths)[order])
            fits = int(peak.max()) < self.pool.capacity - adapter_cells and len(left) <= limit
            if not fits or tokens + req.prompt_len > self.batch_max_tokens:
                break
            batch.append(req)
            tokens += req.prompt_len
        for _ in batch:
            self.waiting.popleft()
        return batch

    def _next_batch(self) -> list[int]:
        """`next_batch`: the adapters of the queue's head, as far as their prompts fit `batch_max_tokens`."""
        adapters: dict[int, None] = {}
        tokens = 0
        for req in self.waiting:
            if tokens + req.prompt_len > self.batch_max_tokens:
                break
            tokens += req.prompt_len
            adapters[req.adapter] = None
        return list(adapters)

    # --- steps (manager.py) ---------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan | None:
        if self.running and self.wait_tokens < self.cfg.max_wait_tokens:
            half, late = self.cfg.max_wait_tokens // 2, self.cfg.max_wait_tokens - 3
            if self.cfg.prefetch and self.wait_tokens in (half, late) and self.waiting:
                self.pool.load(self._next_batch(), prefetch=True)
            self.wait_tokens += 1
            return self._decode()
        batch = self._admit()
        if not batch:
            return self._decode() if self.running else None
        loaded = self.pool.load(dict.fromkeys(r.adapter for r in batch))
        for req in batch:
            req.scheduled_at = now
        prompts = np.array([r.prompt_len for r in batch], np.int64)
        step = SLoraStep(batch, [], loaded)
        usage = self._usage(int(prompts.sum()))
        return StepPlan(prompts, np.zeros(len(batch), np.int64), int(prompts.sum()), 0, usage, payload=step)

    def _decode(self) -> StepPlan:
        rows = self.running
        context = np.array([r.prompt_len + r.num_generated - 1 for r in rows], np.int64)
        usage = self._usage(len(rows))
        step = SLoraStep([], list(rows))
        return StepPlan(np.ones(len(rows), np.int64), context, 0, len(rows), usage, payload=step)

    def _usage(self, stored: int) -> KvUsage:
        pool = self.pool
        return KvUsage(pool.kv + stored, pool.kv + stored + pool.adapters, pool.capacity)

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        step: SLoraStep = plan.payload
        before, self._last_end = self._last_end, now
        finished: list[Request] = []
        if step.prefill:
            self.wait_tokens = 0
            for req in step.prefill:
                req.num_computed = req.prompt_len
                self.pool.kv += req.prompt_len
                req.emit(now)
                if req.done:
                    self.pool.kv -= req.prompt_len
                    finished.append(req)
                else:
                    self.running.append(req)
            return finished  # a prefill step offloads no adapter (`minibatch=True`, lines 262-273)
        self.pool.kv += len(step.decode)
        for req in step.decode:
            if req.last_token_at < before:  # it sat out a prefill-only step
                req.stall(now, True)
            req.emit(now)
            if req.num_generated >= req.output_len:
                req.num_computed = req.prompt_len + req.num_generated - 1
                self.pool.kv -= req.num_computed
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if not r.done]
            self.pool.offload({r.adapter for r in self.running})  # empty: the batch is done, drop all
        return finished

    def in_flight(self) -> list[Request]:
        for req in self.running:  # its KV: the prompt and every token but the latest
            req.num_computed = req.prompt_len + req.num_generated - 1
        return [*self.running, *self.waiting]


def build(config: SLoraConfig, memory: KvBudget) -> SLoraScheduler:
    return SLoraScheduler(config, memory)


register("slora", build)

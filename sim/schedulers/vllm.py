"""vLLM v1's scheduler (0.32.0, FCFS, synchronous): one token budget, paged KV, recompute preemption.

Each step (`vllm/v1/core/sched/scheduler.py`):

1. Running sequences, in admission order, get the tokens they still lack, capped by the remaining budget,
   `long_prefill_token_threshold` (when > 0) and `max_model_len - 1 - computed`. A sequence that cannot get
   blocks preempts the most recently admitted running one (possibly itself, which ends this pass): it frees
   its blocks, forgets its computed tokens, keeps its generated ones and goes to the front of the queue.
2. If nothing was preempted, waiting sequences are admitted FCFS while budget remains and fewer than
   `max_num_seqs` run. Admission needs free blocks for the whole current sequence (minus prefix-cache hits)
   plus the watermark, else admission stops (head-of-line blocking); without chunked prefill a prompt that
   exceeds the remaining budget also stops it.

A request with `n > 1` is fanned out into `n` sequences scheduled independently, as vLLM v1 does; they share
the prompt's full blocks only through the prefix cache (so only with `enable_prefix_caching`), and each holds
its own copy of the partial last prompt block. The request emits a token when its slowest sequence does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sim.errors import SimError
from sim.kv import KvManager, cdiv
from sim.request import Request
from sim.schedulers.base import KvUsage, StepPlan
from sim.schedulers.registry import KvBudget, register


class VllmConfig(BaseModel):
    """Knobs of the `vllm` policy. Prefix caching is off by default (vLLM v1 turns it on) so that runs
    without shared prefixes pay no lookups; enable it for workloads with prefix groups."""

    model_config = ConfigDict(extra="forbid")

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = Field(0, ge=0)
    watermark: float = Field(0.0, ge=0.0, lt=1.0, description="fraction of KV blocks kept free at admission")


class SarathiConfig(VllmConfig):
    """Sarathi-Serve's stall-free batching: decodes first, prefill chunks fill a small token budget.

    The vllm rules already give this order: running sequences go first, and without a long-prefill
    threshold only the most recently admitted one can be mid-prefill, so it comes after every decode.
    Sarathi is therefore the same scheduler with a small budget and chunked prefill on.
    """

    max_num_batched_tokens: int = Field(512, ge=1)
    enable_chunked_prefill: bool = True


@dataclass(slots=True, eq=False)
class Seq:
    """One sequence of a request (a request with `n > 1` has `n`)."""

    sid: int
    req: Request
    child: int
    out_len: int
    num_computed: int = 0
    num_generated: int = 0
    preempted: bool = False  # waiting after a preemption (resumes rather than starts)
    block_size: int = 16

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_len + self.num_generated

    def block_hash(self, j: int) -> Hashable:
        """Content key of block j: the hash chain is shared by a prefix group, then by the prompt's copies."""
        req = self.req
        end = (j + 1) * self.block_size
        if req.prefix_group >= 0 and end <= min(req.prefix_len, req.prompt_len):
            return ("g", req.prefix_group, j)
        if end <= req.prompt_len:
            return ("p", req.id, j)
        return ("s", req.id, self.child, j)


@dataclass(slots=True)
class StepInfo:
    """What one `schedule` call decided (the plan's payload)."""

    rows: list[tuple[Seq, int]] = field(default_factory=list)
    new: list[Seq] = field(default_factory=list)
    resumed: list[Seq] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)


class VllmScheduler:
    """The vLLM v1 scheduling loop over a paged KV cache (see the module docstring)."""

    def __init__(self, config: VllmConfig, budget: KvBudget, watermark_blocks: int | None = None) -> None:
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < budget.max_model_len:
            raise SimError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be at least max_model_len "
                f"({budget.max_model_len}) when chunked prefill is off"
            )
        self.config = config
        self.block_size = budget.block_size
        self.max_model_len = budget.max_model_len
        caching = config.enable_prefix_caching
        self.kv = KvManager(budget.num_blocks, budget.block_size, budget.max_model_len, caching)
        if watermark_blocks is None:
            watermark_blocks = int(config.watermark * budget.num_blocks)
        self.watermark_blocks = watermark_blocks
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self.last = StepInfo()
        self._next_sid = 0
        self._open: dict[int, list[Seq]] = {}  # request id -> its unfinished sequences

    # ---- arrival -------------------------------------------------------------------------------------
    def add(self, request: Request, now: float) -> bool:
        reason = self._reject_reason(request)
        if reason is not None:
            request.reject_reason = reason
            return False
        request.output_len = min(request.output_len, self.max_model_len - request.prompt_len)
        seqs = []
        for child in range(request.n):
            seq = Seq(self._next_sid, request, child, request.output_len, block_size=self.block_size)
            self._next_sid += 1
            seqs.append(seq)
            self.waiting.append(seq)
        self._open[request.id] = seqs
        return True

    def _reject_reason(self, r: Request) -> str | None:
        if r.prompt_len < 1 or r.output_len < 1 or r.n < 1:
            return "empty prompt or output"
        if r.prompt_len >= self.max_model_len:
            return f"prompt of {r.prompt_len} tokens leaves no room within max_model_len {self.max_model_len}"
        usable = self.kv.pool.num_usable
        if cdiv(r.prompt_len, self.block_size) + self.watermark_blocks > usable:
            return f"prompt needs more than the {usable} KV blocks (watermark included)"
        longest = min(r.prompt_len + r.output_len - 1, self.max_model_len)
        if cdiv(longest, self.block_size) > usable:
            return f"a sequence of {longest} tokens needs more than the {usable} KV blocks"
        return None

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        info = StepInfo()
        self.last = info
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(info, budget)
        if not info.preempted:
            self._schedule_waiting(info, budget)
        if not info.rows:
            return None
        return self._plan(info, now)

    def _new_tokens(self, seq: Seq, computed: int, budget: int) -> int:
        n = seq.num_tokens - computed
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def _schedule_running(self, info: StepInfo, budget: int) -> int:
        running, threshold, limit = (
            self.running,
            self.config.long_prefill_token_threshold,
            self.max_model_len - 1,
        )
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed
            n = seq.req.prompt_len + seq.num_generated - computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, limit - computed)
            if n <= 0:
                i += 1
                continue
            while not self.kv.allocate(seq, n):
                victim = running.pop()
                self._preempt(victim)
                info.preempted.append(victim)
                if victim is seq:
                    return budget
            info.rows.append((seq, n))
            budget -= n
            i += 1
        return budget

    def _preempt(self, seq: Seq) -> None:
        self.kv.free(seq)
        seq.num_computed = 0
        self._sync(seq)
        seq.preempted = True
        seq.req.preemptions += 1
        self.waiting.appendleft(seq)

    def _schedule_waiting(self, info: StepInfo, budget: int) -> None:
        waiting, kv = self.waiting, self.kv
        while waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = waiting[0]
            hits, num_hit = kv.lookup(seq)
            cap = budget if self.config.enable_chunked_prefill else seq.num_tokens
            n = self._new_tokens(seq, num_hit, cap)
            if n > budget:
                break
            if kv.blocks_needed(seq, seq.num_tokens, hits) + self.watermark_blocks > kv.num_free:
                break
            if not kv.allocate(seq, n, hits, num_hit):
                break
            kv.record_query(seq, num_hit)
            waiting.popleft()
            self.running.append(seq)
            (info.resumed if seq.preempted else info.new).append(seq)
            seq.preempted = False
            seq.num_computed = num_hit
            seq.req.prefix_hit_tokens += num_hit
            info.rows.append((seq, n))
            budget -= n

    def _plan(self, info: StepInfo, now: float) -> StepPlan:
        rows = info.rows
        new = np.empty(len(rows), dtype=np.int64)
        context = np.empty(len(rows), dtype=np.int64)
        decode = total = 0
        for i, (seq, n) in enumerate(rows):
            req = seq.req
            new[i] = n
            context[i] = seq.num_computed
            total += n
            if (
                n == 1
                and seq.num_generated > 0
                and seq.num_computed + 1 == req.prompt_len + seq.num_generated
            ):
                decode += 1
            if math.isnan(req.scheduled_at):
                req.scheduled_at = now
            seq.num_computed += n
            if req.n == 1:
                req.num_computed = seq.num_computed
            else:
                self._sync(seq)
        used = self.kv.allocated - self.kv.waste
        usage = KvUsage(used=used, allocated=self.kv.allocated, capacity=self.kv.capacity)
        return StepPlan(
            new_tokens=new,
            context=context,
            num_prefill_tokens=total - decode,
            num_decode_tokens=decode,
            kv=usage,
            payload=info,
            preempted=len(info.preempted),
        )

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        info: StepInfo = plan.payload
        finished: list[Request] = []
        done_seqs: list[Seq] = []
        for seq, _ in info.rows:
            if seq.num_computed < seq.num_tokens:
                continue
            seq.num_generated += 1
            self._emit(seq, now)
            if seq.num_generated >= seq.out_len:
                done_seqs.append(seq)
        if done_seqs:
            gone = set(map(id, done_seqs))
            self.running = [s for s in self.running if id(s) not in gone]
            for seq in done_seqs:
                self.kv.free(seq)
                if self._close(seq):
                    finished.append(seq.req)
        return finished

    def _sync(self, seq: Seq) -> None:
        """Mirror progress on the request: its sequences' computed tokens, summed."""
        req = seq.req
        if req.n == 1:
            req.num_computed = seq.num_computed
        else:
            req.num_computed = sum(s.num_computed for s in self._open[req.id])

    def _emit(self, seq: Seq, now: float) -> None:
        """One token for `seq`; its request emits when its slowest open sequence has."""
        req = seq.req
        if req.n == 1:
            req.emit(now)
            return
        slowest = min(s.num_generated for s in self._open[req.id])
        while req.num_generated < slowest:
            req.emit(now)

    def _close(self, seq: Seq) -> bool:
        """Forget a finished sequence; True when it was its request's last."""
        seqs = self._open[seq.req.id]
        if seq.req.n > 1:
            seqs.remove(seq)
        else:
            seqs.clear()
        if seqs:
            return False
        del self._open[seq.req.id]
        return True

    @property
    def num_waiting(self) -> int:
        """Sequences queued (new or preempted)."""
        return len(self.waiting)

    def wake_at(self, now: float) -> float | None:
        return None

    def in_flight(self) -> list[Request]:
        return [seqs[0].req for seqs in self._open.values()]


def build_vllm(config: VllmConfig, budget: KvBudget) -> VllmScheduler:
    return VllmScheduler(config, budget)


register("vllm", VllmConfig, build_vllm)
register("sarathi", SarathiConfig, build_vllm)

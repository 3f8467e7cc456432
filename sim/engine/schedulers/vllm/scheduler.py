"""vLLM v1's scheduler (0.32.0, FCFS, synchronous): one token budget, paged KV, recompute preemption.

Each step (`vllm/v1/core/sched/scheduler.py`):

1. Running sequences, in admission order, get the tokens they still lack, capped by the remaining budget,
   `long_prefill_token_threshold` (when > 0) and `max_model_len - 1 - computed`. A sequence that cannot get
   blocks preempts the most recently admitted running one (possibly itself, which ends this pass): it frees
   its blocks, forgets its computed tokens, keeps its generated ones and goes to the front of the queue.
2. If nothing was preempted, waiting sequences are admitted FCFS while budget remains and fewer than
   `max_num_seqs` run. Admission needs free blocks for the whole current sequence (minus prefix-cache hits)
   plus, while any sequence runs, the watermark, else admission stops (head-of-line blocking); without
   chunked prefill a prompt that exceeds the remaining budget also stops it.

`long_prefill_token_threshold` applies only in steps that begin with more than one sequence running or
waiting: a lone sequence may use the whole budget.

A request with `n > 1` is fanned out into `n` sequences scheduled independently, as vLLM v1 does; they share
the prompt's full blocks only through the prefix cache (so only with `enable_prefix_caching`), and each holds
its own copy of the partial last prompt block. The request emits a token when its slowest sequence does.

With `fast=True` (what `sim run` builds) sequences that only decode are advanced in bulk, and runs of steps
that only they decode are advanced at once, with the same records (bulk.py, quiet.py, docs/performance.md).

Pipeline parallelism (`pipeline`, sim/engine/pipeline.py): up to `pp` batches in flight. Scheduling a row
advances its computed tokens at once, so a sequence whose scheduled tokens are all in flight has none left
to schedule and is passed over, as in vLLM; a prompt's next chunk may follow its previous one. A sequence
preempted while a batch holding it is in flight still gets that batch's token (vLLM's `update_from_output`
appends it), and one that ends so leaves the waiting queue. No bulk decoding then.

Asynchronous scheduling (`async_scheduling`, vLLM's default since 0.14): the engine forms step k + 1 when step
k starts, so an arrival during step k is first seen by step k + 2 (`schedule`; docs/vllm-conformance.md).

This module holds the scheduler's state, the step (`schedule`, `update`) and the policy's factory; the step's
parts are mixed into `VllmScheduler` from their own modules, which share its state:

- admission.py (`Admission`): arrivals, the waiting queue and its admissions (step 2);
- running.py (`RunningPass`): the running sequences' rows and recompute preemption (step 1);
- bulk.py (`BulkDecoding`): the sequences advanced in bulk (fast mode);
- quiet.py (`QuietRuns`, over `BulkDecoding`): decode-only runs of them, which the engine advances at once;
- groups.py (`SequenceGroups`): a request's sequences, and the tokens the step's rows emit;
- plan.py: a sequence (`Seq`), one step's decisions (`StepInfo`) and its plan (`VllmPlan`).

spec.py subclasses `VllmScheduler` for speculative decoding and registers it in `VARIANTS`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from operator import add, mul

from sim.config.policies import VllmConfig
from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan, StepTotals
from sim.cost.memory import KvBudget
from sim.engine.kv import KvManager
from sim.engine.lora import LoraGate
from sim.engine.schedulers.registry import register
from sim.engine.schedulers.vllm.admission import Admission
from sim.engine.schedulers.vllm.groups import SequenceGroups
from sim.engine.schedulers.vllm.plan import Seq, StepInfo, VllmPlan
from sim.engine.schedulers.vllm.quiet import QuietRuns
from sim.engine.schedulers.vllm.running import RunningPass
from sim.io.errors import SimError


class VllmScheduler(Admission, RunningPass, QuietRuns, SequenceGroups):
    """The vLLM v1 scheduling loop over a paged KV cache (see the module docstring).

    Scheduling a row also applies it (computed tokens advance at once; `update` only emits): nothing between
    `schedule` and `update` reads a scheduled sequence's progress, and a preemption never picks a sequence
    already scheduled in the same step.
    """

    def __init__(
        self, config: VllmConfig, budget: KvBudget, watermark_blocks: int | None = None, fast: bool = False
    ) -> None:
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < budget.max_model_len:
            raise SimError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be at least max_model_len "
                f"({budget.max_model_len}) when chunked prefill is off"
            )
        self.config = config
        self.block_size = budget.block_size
        self.max_model_len = budget.max_model_len
        self.token_budget = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.threshold = config.long_prefill_token_threshold
        caching = config.enable_prefix_caching
        self.kv = KvManager(budget.num_blocks, budget.block_size, budget.max_model_len, caching)
        self.capacity = self.kv.capacity
        if watermark_blocks is None:
            watermark_blocks = int(config.watermark * budget.num_blocks)
        self.watermark_blocks = watermark_blocks
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        # Asynchronous scheduling: vLLM forms step k+1 as soon as step k is launched, so a request that
        # arrives while step k runs is seen only when step k+2 is formed. Arrivals wait in `_held` (with their
        # arrival times) until the step being formed could have seen them.
        self.async_scheduling = config.async_scheduling
        self._held: deque[tuple[float, list[Seq]]] = deque()
        self._held_seqs = 0  # sequences in `_held`
        self._step_start = 0.0  # when the latest planned step started
        self.last = StepInfo()
        self._next_sid = 0
        self._open: dict[int, list[Seq]] = {}  # request id -> its unfinished sequences
        # Bulk decoding (bulk.py): with `fast`, the running sequences that only decode are advanced in
        # bulk, and `last` then lists only the rows handled one by one.
        self.fast = fast
        self._order = 0  # admissions so far: the next admitted sequence's position in the running list
        self._step = 0  # steps scheduled
        self._last_end = 0.0  # when the latest applied step ended (0 before any)
        self._prev_end = 0.0  # when the step before the one being applied ended (`SequenceGroups`)
        self._init_bulk(caching)
        self.pipelined = False  # batches in flight (`pipeline`)

    def pipeline(self, in_flight: int) -> bool:
        """Keep up to `in_flight` batches in flight (before any request): rows handled one by one."""
        if in_flight <= 1:
            return False
        self.fast = False
        self._init_bulk(self.kv.caching)
        self.pipelined = True
        return True

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        if not self._held:
            plan = self._schedule(now)
        else:
            # Formed back to back with the step that just ended, this step was formed when that one started;
            # had it nothing to run then, it is formed now, seeing every arrival (vLLM's engine loop).
            self._release(self._step_start if self._step and self._last_end == now else now)
            plan = self._schedule(now)
            if plan is None and self._held:
                self._release(now)
                plan = self._schedule(now)
        if plan is not None:
            self._step_start = now
        return plan

    def _schedule(self, now: float) -> StepPlan | None:
        info = StepInfo()
        self.last = info
        # the threshold keeps a long prefill from starving others: with nobody else to starve it is off
        threshold = self.threshold if len(self.running) + len(self.waiting) > 1 else 0
        if self.fast:
            budget = self._schedule_fast(info, threshold)
        else:
            budget = self._schedule_running(info, self.running, self.token_budget, threshold)
        if self.waiting and not info.preempted:
            self._schedule_waiting(info, budget, now, threshold)
        if not info.seqs and not info.bulk:
            return None
        self._step += 1
        return self._plan(info)

    def _plan(self, info: StepInfo) -> VllmPlan:
        counts, contexts = info.counts, info.contexts
        if not counts:  # every row in bulk
            rows = tokens = ones = ctx = cq = cc = max_end = 0
        else:
            rows, tokens, ones, ctx = len(counts), sum(counts), counts.count(1), sum(contexts)
            if ones == rows:  # one token per row: c·q = q, c² = 1
                cq, cc, max_end = ctx, rows, max(contexts) + 1
            else:
                cq, cc = sum(map(mul, counts, contexts)), sum(map(mul, counts, counts))
                max_end = max(map(add, counts, contexts))
        if info.bulk:  # one token each on their contexts
            bulk = info.bulk
            rows, tokens, ones, cc = rows + bulk, tokens + bulk, ones + bulk, cc + bulk
            ctx, cq = ctx + info.bulk_ctx, cq + info.bulk_ctx
            max_end = max(max_end, info.bulk_max + 1)
        kv = self.kv
        allocated = kv.allocated
        usage = KvUsage(allocated - kv.waste, allocated, self.capacity)  # used, allocated, capacity
        return VllmPlan(info, StepTotals(rows, tokens, ones, cq, cc, ctx, max_end), usage)

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        info: StepInfo = plan.payload
        self._prev_end, self._applying = self._last_end, info
        if self.fast:
            return self._update_fast(info, now)
        self._last_end = now
        finished: list[Request] = []
        done_seqs = self._emit_rows(info.emit, now)
        if done_seqs:
            gone = set(done_seqs)
            self.running = [s for s in self.running if s not in gone]
            if self.pipelined and any(s.preempted for s in done_seqs):  # finished while queued (vLLM)
                self.waiting = deque(s for s in self.waiting if s not in gone)
            for seq in done_seqs:
                self.kv.free(seq)
                if self._close(seq):
                    finished.append(seq.req)
        return finished

    def wake_at(self, now: float) -> float | None:
        return None

    def in_flight(self) -> list[Request]:
        for seq in self.running:
            if seq.bulk_since >= 0:
                self._wake(seq)
                self._busy[seq] = None
        return [seqs[0].req for seqs in self._open.values()]


# Schedulers that take the place of `VllmScheduler` when a config asks for a feature, by feature; each
# registers itself here from its own module (spec.py: "speculative"), as policies do in the registry.
VARIANTS: dict[str, Callable[[VllmConfig, KvBudget], VllmScheduler]] = {}


def build_vllm(config: VllmConfig, budget: KvBudget) -> VllmScheduler:
    if config.speculative is not None:  # speculative decoding: its own rows, no bulk decoding
        return VARIANTS["speculative"](config, budget)
    if config.lora is not None:  # LoRA costs each step by its rows' adapters: no bulk decoding
        scheduler = VllmScheduler(config, budget, fast=False)
        scheduler.lora_gate = LoraGate(config.lora.max_loras)
        return scheduler
    return VllmScheduler(config, budget, fast=True)


register("vllm", build_vllm)
register("sarathi", build_vllm)

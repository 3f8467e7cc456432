"""Multi-tenant LoRA at run time: the adapters' GPU slots and host cache, the scheduler's gate, the step time.

The workload names an adapter per request (`[workload.lora]`: N adapters, uniform or Zipf popularity, or a
trace's `adapter` column); a policy serves them with `lora = { max_loras, max_cpu_loras, max_lora_rank }`,
as vLLM does with `--enable-lora`:

- Memory (sim/cost/lora.py). vLLM preallocates `max_loras` GPU slots at `max_lora_rank` for every
LoRA-capable linear module of
  the model (q/k/v/o and the gated MLP's gate/up/down) when it loads the model, before it sizes the KV cache:
  the slots come out of the KV budget (`slot_bytes`, `lora_memory`). Under tensor parallelism a
  column-parallel module keeps its whole A (in x r) and a shard of B (r x out / tp); a row-parallel one a
  shard of A (in / tp x r) and its whole B (vllm/lora/layers: ColumnParallelLinearWithLoRA,
  RowParallelLinearWithLoRA).
- Residency (`LoraCache`, vllm/lora/worker_manager.py LRUCacheWorkerLoRAManager). Before each step the
  worker makes every adapter of the batch resident: one not in host memory is read from disk into the host
  cache (`max_cpu_loras`, LRU), then copied over PCIe into a GPU slot (`max_loras`, LRU). The copy is
  synchronous: the step that first runs a request of that adapter pays it. Only adapters not in the step's
  batch are evicted.
- Scheduling (`LoraGate`, vllm/v1/core/sched/scheduler.py): a waiting request whose adapter is not among
  the step's scheduled adapters is skipped, not blocking the queue, once those number `max_loras`.
- Cost (`LoraCost`, sim/cost/lora.py): each LoRA-wrapped module runs a shrink (tokens x in x r) and an expand
  (tokens x r x out) kernel over the whole batch, SGMV/Punica-style, at the slots' padded rank
  `max_lora_rank`; the kernels read each distinct adapter's slot weights once, plus the activations in and
  out, and each kernel launch pays a fixed cost.

The tables (`[workload.lora]`, a policy's `lora`): sim/config/lora.py. The records' LoRA columns and the
summary's `lora` block: sim/engine/lora_records.py; `sim capacity --max-loras`: sim/studies/capacity.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.links import get_link
from sim.catalog.model import ModelSpec
from sim.config.lora import LoraConfig, LoraWorkload
from sim.core.step import StepPlan
from sim.cost.lora import HOST_LINK, LoraCost, adapter_bytes, lora_memory, slot_bytes
from sim.cost.memory import KvMemory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError

# --- configuration ------------------------------------------------------------------------------------


# --- popularity ---------------------------------------------------------------------------------------


# --- sizes --------------------------------------------------------------------------------------------


# --- residency ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Residency:
    """What one step's activation did: adapters in the batch, copies to the GPU, reads from disk, seconds."""

    adapters: int = 0
    loads: int = 0
    disk_loads: int = 0
    seconds: float = 0.0


Seconds = float | Callable[[int], float]  # the same for every adapter, or a function of the adapter id


class LoraCache:
    """GPU slots and host cache, each LRU; `activate` makes a batch's adapters resident. `load_s` and
    `disk_s`: seconds to copy an adapter host -> GPU and to read it disk -> host."""

    def __init__(self, gpu_slots: int, cpu_slots: int, load_s: Seconds, disk_s: Seconds) -> None:
        self.gpu: OrderedDict[int, None] = OrderedDict()
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.gpu_slots, self.cpu_slots = gpu_slots, cpu_slots
        self.load_s = load_s if callable(load_s) else lambda _a, s=float(load_s): s
        self.disk_s = disk_s if callable(disk_s) else lambda _a, s=float(disk_s): s

    @staticmethod
    def _insert(cache: OrderedDict[int, None], key: int, size: int, keep: set[int]) -> None:
        if len(cache) >= size:
            victim = next((k for k in cache if k not in keep), None)
            if victim is None:
                raise SimError(f"more than {size} LoRA adapters needed at once")
            del cache[victim]
        cache[key] = None

    def activate(self, adapters: Sequence[int]) -> Residency:
        """Make `adapters` (distinct, in batch order) resident; the copies it took and their seconds."""
        out = Residency(len(adapters))
        keep = set(adapters)
        for a in adapters:
            if a in self.gpu:
                self.gpu.move_to_end(a)
                self.cpu.move_to_end(a)
                continue
            if a in self.cpu:
                self.cpu.move_to_end(a)
            else:
                self._insert(self.cpu, a, self.cpu_slots, keep)
                out.disk_loads += 1
                out.seconds += self.disk_s(a)
            self._insert(self.gpu, a, self.gpu_slots, keep)
            out.loads += 1
            out.seconds += self.load_s(a)
        return out


# --- step cost ----------------------------------------------------------------------------------------


class LoraStepTime:
    """The engine's step time with LoRA: the base model's, plus the LoRA kernels, plus the adapters' loads
    (paid synchronously before the step). `last` holds the latest step's residency for the records."""

    def __init__(self, cost: CostModel, lora: LoraCost, cache: LoraCache) -> None:
        self.cost, self.lora, self.cache = cost, lora, cache
        self.last = Residency()

    def __call__(self, new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        return self.cost.step_time(new_tokens, context)

    def plan_time(self, plan: StepPlan) -> tuple[float, bool]:
        totals = getattr(plan, "totals", None)
        timed = self.cost.step_time_totals(*totals) if totals is not None else None
        seconds, bound = timed if timed is not None else self.cost.step_time(plan.new_tokens, plan.context)
        info = plan.payload
        order: dict[int, None] = {}
        tokens = 0
        for seq, count in zip(info.seqs, info.counts, strict=True):
            a = seq.req.adapter
            if a >= 0:
                order[a] = None
                tokens += count
        self.last = self.cache.activate(list(order))
        return seconds + self.lora.seconds(tokens, len(order)) + self.last.seconds, bound


# --- scheduling ---------------------------------------------------------------------------------------


class LoraGate:
    """vLLM's max_loras rule for one `schedule` call: the adapters of the running requests scheduled so
    far; a waiting one with another adapter is skipped once they number `max_loras`."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.scheduled: set[int] = set()

    def start(self, seqs: Iterable[Any]) -> LoraGate:
        self.scheduled = {s.req.adapter for s in seqs if s.req.adapter >= 0}
        return self

    def skip(self, seq: Any) -> bool:
        a = seq.req.adapter
        return a >= 0 and len(self.scheduled) >= self.max_loras and a not in self.scheduled

    def admit(self, seq: Any) -> None:
        if seq.req.adapter >= 0:
            self.scheduled.add(seq.req.adapter)


# --- one run ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class LoraRun:
    """LoRA's parts of one run: the step time, and the figures for the summary."""

    step_time: LoraStepTime
    config: LoraConfig
    workload: LoraWorkload | None
    adapter_bytes: int  # the largest adapter's, with several ranks
    slot_bytes: int
    blocks_without: int
    blocks_with: int

    def info(self) -> dict[str, Any]:
        return {
            "max_loras": self.config.max_loras,
            "max_cpu_loras": self.config.cpu_slots,
            "max_lora_rank": self.config.max_lora_rank,
            "adapter_bytes": self.adapter_bytes,
            "slot_bytes": self.slot_bytes,
            "slots_bytes": self.slot_bytes * self.config.max_loras,
            "kv_blocks_without_slots": self.blocks_without,
            "kv_blocks_with_slots": self.blocks_with,
        }


def setup_lora(
    model: ModelSpec, gpu: Gpu, tp: int, cost: CostModel, kv: KvMemory, config: LoraConfig,
    workload: LoraWorkload | None,
) -> tuple[LoraRun, KvMemory]:  # fmt: skip
    """The LoRA parts of a replica, and its KV budget with the slots taken out."""
    reduced = lora_memory(kv, model, config)
    link = get_link(config.host_link or HOST_LINK.get(gpu.name, "pcie-gen4-x16"))
    ranks = workload.ranks if workload is not None else ()
    size = {r: adapter_bytes(model, r, workload.target_modules, tp) for r in ranks} if workload else {}

    def nbytes(adapter: int) -> int:
        assert workload is not None
        return size[workload.rank_of(adapter)]

    cache = LoraCache(
        config.max_loras,
        config.cpu_slots,
        lambda a: link.latency_s + nbytes(a) / link.bandwidth,
        lambda a: nbytes(a) / config.disk_bandwidth,
    )
    timer = LoraStepTime(cost, LoraCost(model, gpu, tp, config.max_lora_rank, cost), cache)
    slot = slot_bytes(model, config.max_lora_rank, tp)
    run = LoraRun(
        timer, config, workload, max(size.values(), default=0), slot, kv.num_blocks, reduced.num_blocks
    )
    return run, reduced

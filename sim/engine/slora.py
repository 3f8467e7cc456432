"""S-LoRA's adapters at run time: the pool cells each takes, and a step's time with its kernels and loads.

The scheduler (sim/engine/schedulers/slora.py) decides which adapters are resident and which it loaded
before a step; this module costs them:

- Cells. An adapter takes its bytes (sim/cost/lora.py `adapter_bytes`: layers x Σ rank x (in + out) x 2 B)
  over one pool cell's, the KV bytes of one token, rounded up: 4r cells for rank r on q/k/v/o of a model
  whose K and V widths are its hidden size (S-LoRA's `a_len = r * 4`).
- Loads. S-LoRA keeps every adapter in host memory (`--swap`) and copies one to the GPU when a step needs it,
  synchronously (`manager.py` lines 191-196, 239-243): the step waits for bytes / link bandwidth + the
  link's start-up latency per adapter (the GPU's PCIe, sim/catalog/links.toml).
- Kernels. S-LoRA's MBGMM (prefill, Triton `lora_get_qkvo_fwd_shrink/expand`) and MBGMV (decode,
  `dispatch_bgmv`) kernels run a shrink and an expand per adapted module and layer over the whole batch,
  each row at its adapter's rank, reading each distinct adapter's weights once
  (`slora/models/peft/lora_unordered_batch_infer.py`).
  `LoraCost` costs them unpacked, on the adapters' modules, at the adapters' largest rank (with one rank, as
  in S-LoRA's setting S1, exactly that rank).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.catalog.gpus import Gpu
from sim.catalog.links import get_link
from sim.catalog.model import ModelSpec
from sim.config.lora import ATTENTION_MODULES, LoraWorkload
from sim.config.policies import SLoraConfig
from sim.core.step import StepPlan
from sim.cost.lora import HOST_LINK, LoraCost, adapter_bytes
from sim.cost.roofline import CostModel
from sim.engine.lora import Residency
from sim.engine.schedulers.slora import SLoraScheduler, SLoraStep
from sim.io.errors import SimError


class SLoraStepTime:
    """The base model's step time, plus the LoRA kernels over the step's distinct adapters, plus the loads
    the scheduler made before it. `last` holds the latest step's residency for the records."""

    def __init__(self, cost: CostModel, lora: LoraCost, load_s: Callable[[int], float]) -> None:
        self.cost, self.lora, self.load_s = cost, lora, load_s
        self.last = Residency()

    def __call__(self, new_tokens: Any, context: Any) -> tuple[float, bool]:
        return self.cost.step_time(new_tokens, context)

    def plan_time(self, plan: StepPlan) -> tuple[float, bool]:
        seconds, bound = self.cost.step_time(plan.new_tokens, plan.context)
        step: SLoraStep = plan.payload
        rows = step.prefill or step.decode
        names = [r.adapter for r in rows]
        adapters = set(names)
        adapters.discard(-1)
        if step.prefill:  # tokens of rows with an adapter
            tokens = sum(r.prompt_len for r in rows if r.adapter >= 0)
        else:
            tokens = len(rows) - names.count(-1)
        load = sum(self.load_s(a) for a in step.loaded)
        self.last = Residency(len(adapters), len(step.loaded), 0, load)
        return seconds + self.lora.seconds(tokens, len(adapters)) + load, bound


@dataclass(slots=True)
class SLoraRun:
    """The LoRA parts of one `slora` run: the step time, and the figures for the summary's `lora` block."""

    step_time: SLoraStepTime
    workload: LoraWorkload | None
    adapter_bytes: int  # the largest adapter's
    adapter_cells: int  # the largest adapter's cells
    pool_cells: int
    blocks_without: int
    blocks_with: int

    def info(self) -> dict[str, Any]:
        return {"adapter_bytes": self.adapter_bytes, "adapter_cells": self.adapter_cells,
                "pool_cells": self.pool_cells}  # fmt: skip


def setup_slora(
    model: ModelSpec, gpu: Gpu, tp: int, cost: CostModel, kv_bytes_per_token: int, config: SLoraConfig,
    workload: LoraWorkload | None, scheduler: SLoraScheduler, kv_blocks: int,
) -> SLoraRun:  # fmt: skip
    """Give `scheduler` its adapters' cells and build the step time that costs them."""
    modules = list(ATTENTION_MODULES) if workload is None else workload.target_modules
    others = [m for m in modules if m not in ATTENTION_MODULES]
    if others:
        raise SimError(
            "workload.lora.target_modules: S-LoRA's adapters adapt q_proj, k_proj, v_proj and o_proj only "
            f"(its adapter layers hold those four), not {', '.join(others)}"
        )
    ranks = workload.ranks if workload is not None else (8,)
    size = {r: adapter_bytes(model, r, modules, tp) for r in ranks}
    cells = {r: math.ceil(b / kv_bytes_per_token) for r, b in size.items()}
    rank_of = workload.rank_of if workload is not None else (lambda _a: ranks[0])
    scheduler.serve_adapters(lambda a: cells[rank_of(a)])
    link = get_link(config.host_link or HOST_LINK.get(gpu.name, "pcie-gen4-x16"))

    def load_s(adapter: int) -> float:
        return link.latency_s + size[rank_of(adapter)] / link.bandwidth

    lora = LoraCost(model, gpu, tp, max(ranks), cost, modules, packed=False)
    timer = SLoraStepTime(cost, lora, load_s)
    largest = max(ranks)
    pool = scheduler.pool.capacity
    return SLoraRun(timer, workload, size[largest], cells[largest], pool, kv_blocks, kv_blocks)

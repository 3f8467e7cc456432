"""Multi-tenant LoRA: adapters per request, their sizes, GPU slots and host cache, and their step cost.

The workload names an adapter per request (`[workload.lora]`: N adapters, uniform or Zipf popularity, or a
trace's `adapter` column); a policy serves them with `lora = { max_loras, max_cpu_loras, max_lora_rank }`,
as vLLM does with `--enable-lora`:

- Memory. vLLM preallocates `max_loras` GPU slots at `max_lora_rank` for every LoRA-capable linear module of
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
- Cost (`LoraCost`): each LoRA-wrapped module runs a shrink (tokens x in x r) and an expand
  (tokens x r x out) kernel over the whole batch, SGMV/Punica-style, at the slots' padded rank
  `max_lora_rank`; the kernels read each distinct adapter's slot weights once, plus the activations in and
  out, and each kernel launch pays a fixed cost.

The records' LoRA columns, the summary's `lora` block and `sim capacity --max-loras`: sim/engine/lora_records.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.io.errors import SimError

if TYPE_CHECKING:
    from sim.cost.memory import KvMemory
    from sim.cost.roofline import CostModel
    from sim.engine.schedulers.base import StepPlan

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
MODULES = ATTENTION_MODULES + MLP_MODULES
ROW_PARALLEL = frozenset({"o_proj", "down_proj"})
# vLLM runs one shrink and one expand kernel per LoRA layer; q/k/v and gate/up are packed layers.
PACKED = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
# vLLM's accepted --max-lora-rank values (vllm/config LoRAConfig.possible_max_ranks).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Host link of each catalogue GPU (sim/catalog/links.toml); a policy's `host_link` overrides it.
HOST_LINK = {"A100-40GB": "pcie-gen4-x16", "A100-80GB": "pcie-gen4-x16", "H100-SXM": "pcie-gen5-x16",
             "H100-PCIe": "pcie-gen5-x16", "H200": "pcie-gen5-x16", "B200": "pcie-gen5-x16",
             "L4": "pcie-gen4-x16", "L40S": "pcie-gen4-x16", "A10G": "pcie-gen4-x16", "T4": "pcie-gen3-x16",
             "MI300X": "pcie-gen5-x16"}  # fmt: skip
# Disk to host memory: an assumption, not a measurement. An NVMe SSD reads 3.5 GB/s (PCIe Gen3 x4) to
# 7 GB/s (Gen4 x4) sequentially; reading an adapter's safetensors file and building its tensors costs more
# than the raw read, so 2 GB/s. Set `disk_bandwidth` to what the deployment's storage delivers.
DISK_BANDWIDTH = 2e9
LORA_BYTES = 2  # adapters are served in the model's 16-bit dtype (vLLM's lora_dtype "auto")


# --- configuration ------------------------------------------------------------------------------------


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Rank = Annotated[int, Field(ge=1, le=512)]


class LoraWorkload(_Config):
    """`[workload.lora]`: which adapter each request names.

    `adapters` adapters, numbered 0 .. adapters - 1, drawn per request with `popularity` "uniform" or
    "zipf" (adapter i with probability proportional to 1 / (i + 1)^zipf_s); a trace's `adapter` column
    (-1: the base model) overrides the draw. Every adapter adapts `target_modules` at rank `rank`, or, with
    a list of ranks, adapter i at rank `rank[i % len(rank)]` (e.g. [64, 32, 16, 8] for a mix).
    """

    adapters: int = Field(gt=0, le=1_000_000)
    popularity: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = Field(1.0, ge=0.0, le=10.0)
    rank: Rank | list[Rank] = Field(8, description="one rank, or a list assigned round-robin")
    target_modules: list[Literal[MODULES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(ATTENTION_MODULES), min_length=1
    )

    @model_validator(mode="after")
    def _distinct(self) -> LoraWorkload:
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError("target_modules: each module at most once")
        if isinstance(self.rank, list) and not self.rank:
            raise ValueError("rank: give one rank or a non-empty list")
        return self

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.rank) if isinstance(self.rank, list) else (self.rank,)

    def rank_of(self, adapter: int) -> int:
        ranks = self.ranks
        return ranks[adapter % len(ranks)]


class LoraConfig(_Config):
    """A policy's `lora` table (vLLM's --max-loras, --max-cpu-loras, --max-lora-rank)."""

    max_loras: int = Field(1, ge=1, le=4096, description="adapters in GPU slots, and per batch")
    max_cpu_loras: int | None = Field(None, ge=1, le=1_000_000, description="host cache (default max_loras)")
    max_lora_rank: int = Field(16, description=f"slot rank, one of {MAX_LORA_RANKS}")
    host_link: str | None = Field(None, description="host-to-GPU link (default: the GPU's PCIe)")
    disk_bandwidth: float = Field(DISK_BANDWIDTH, gt=0, le=1e12, description="disk to host, bytes/s")

    @model_validator(mode="after")
    def _valid(self) -> LoraConfig:
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank: one of {', '.join(map(str, MAX_LORA_RANKS))}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras: at least max_loras ({self.max_loras})")
        return self

    @property
    def cpu_slots(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


def check_lora(scenario: Any, configs: dict[str, BaseModel], source: str) -> None:
    """A workload that names adapters needs LoRA on every policy (vLLM refuses a LoRA request without
    --enable-lora), within the slots' rank; LoRA is modelled for single replicas of the vllm policies."""
    wl: LoraWorkload | None = scenario.workload.lora
    for name, config in configs.items():
        lora = getattr(config, "lora", None)
        kind = scenario.policies[name]["scheduler"]
        if wl is not None and lora is None:
            hint = "add lora = { max_loras = ... }" if hasattr(config, "lora") else "use vllm or sarathi"
            raise SimError(
                f"{source}: policies.{name}.lora: the workload names LoRA adapters (workload.lora) but this "
                f"{kind} policy does not serve them; {hint}"
            )
        if lora is not None and wl is not None and max(wl.ranks) > lora.max_lora_rank:
            raise SimError(
                f"{source}: policies.{name}.lora.max_lora_rank: {lora.max_lora_rank} is below the adapters' "
                f"rank {max(wl.ranks)} (workload.lora.rank)"
            )
        if lora is not None and scenario.cluster is not None:
            raise SimError(f"{source}: policies.{name}.lora: LoRA is not modelled with [cluster]")
        if lora is not None and lora.host_link is not None:
            from sim.catalog.links import link_names

            if lora.host_link not in link_names():
                raise SimError(
                    f"{source}: policies.{name}.lora.host_link: unknown link {lora.host_link[:40]!r} "
                    f"(one of {', '.join(link_names())})"
                )


# --- popularity ---------------------------------------------------------------------------------------


def popularity(config: LoraWorkload) -> np.ndarray:
    """Each adapter's probability: uniform, or Zipf (1 / (i + 1)^s, normalised)."""
    n = config.adapters
    if config.popularity == "uniform" or config.zipf_s == 0:
        return np.full(n, 1.0 / n)
    weights = np.arange(1, n + 1, dtype=np.float64) ** -config.zipf_s
    return weights / weights.sum()


class AdapterSampler:
    """Draws adapter ids by inverting the popularity's CDF (one uniform draw per request)."""

    def __init__(self, config: LoraWorkload) -> None:
        cdf = np.cumsum(popularity(config))
        cdf[-1] = 1.0
        self._cdf = cdf

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self._cdf, rng.random(n), side="right").astype(np.int64)


# --- sizes --------------------------------------------------------------------------------------------


def module_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) of each LoRA-capable linear module of one layer (whole, not sharded)."""
    if model.attention == "MLA":
        raise SimError(f"{model.name}: LoRA adapters are not modelled for MLA attention")
    h = model.hidden_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    o_in = model.num_heads * model.v_head_dim
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (o_in, h)}
    if not model.is_moe and model.model_type != "opt" and model.dense_params:
        inter = round(model.dense_params / model.num_layers / (3 * h))  # gated MLP: gate, up, down
        shapes.update(gate_proj=(h, inter), up_proj=(h, inter), down_proj=(inter, h))
    return shapes


def per_gpu_widths(model: ModelSpec, name: str, shape: tuple[int, int], tp: int) -> tuple[int, int]:
    """(A's input width, B's output width) on one GPU: column-parallel modules shard B's output (KV heads
    replicated below one per GPU), row-parallel ones A's input."""
    inp, out = shape
    if name in ROW_PARALLEL:
        return inp // tp, out
    if name in ("k_proj", "v_proj"):
        return inp, max(1, model.num_kv_heads // tp) * model.head_dim
    return inp, out // tp


def adapter_bytes(model: ModelSpec, rank: int, modules: Iterable[str], tp: int = 1) -> int:
    """Bytes of one adapter per GPU: layers x Σ over its modules of rank x (in + out) x 2 bytes."""
    shapes = module_shapes(model)
    total = 0
    for name in modules:
        if name not in shapes:
            raise SimError(f"{model.name}: no {name} module to adapt (LoRA-capable: {', '.join(shapes)})")
        a_in, b_out = per_gpu_widths(model, name, shapes[name], tp)
        total += rank * (a_in + b_out)
    return model.num_layers * total * LORA_BYTES


def slot_bytes(model: ModelSpec, max_lora_rank: int, tp: int = 1) -> int:
    """One GPU slot: every LoRA-capable module at `max_lora_rank` (what vLLM preallocates per slot)."""
    return adapter_bytes(model, max_lora_rank, module_shapes(model), tp)


def lora_memory(kv: KvMemory, model: ModelSpec, config: LoraConfig) -> KvMemory:
    """The KV budget once `max_loras` slots are taken from the memory left for KV."""
    taken = config.max_loras * slot_bytes(model, config.max_lora_rank, kv.tp)
    available = kv.kv_bytes_available - taken
    if available < kv.block_bytes:
        raise SimError(
            f"{config.max_loras} LoRA slots of rank {config.max_lora_rank} take {taken / 1e9:.2f} GB, more "
            f"than the {kv.kv_bytes_available / 1e9:.2f} GB left for the KV cache"
        )
    return replace(kv, kv_bytes_available=available, num_blocks=available // kv.block_bytes)


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


class LoraCost:
    """Seconds of a step's LoRA kernels (shrink and expand per LoRA layer, over the whole batch)."""

    def __init__(self, model: ModelSpec, gpu: Gpu, tp: int, max_lora_rank: int, cost: CostModel) -> None:
        from sim.cost.kernel_model import KernelCalibration

        shapes = module_shapes(model)
        widths = [per_gpu_widths(model, n, s, tp) for n, s in shapes.items()]
        layers, r = model.num_layers, max_lora_rank
        self.flops_token = 2.0 * layers * r * sum(a + b for a, b in widths)  # shrink + expand FLOPs
        # activations: shrink reads x; expand reads the r-wide buffer and reads and writes y
        self.act_bytes_token = LORA_BYTES * layers * sum(a + r + 2 * b for a, b in widths)
        self.slot_bytes = slot_bytes(model, r, tp)
        self.kernels = 2 * layers * sum(1 for group in PACKED if any(m in shapes for m in group))
        self.fixed_s = KernelCalibration.load().graph_kernel_fixed_s  # sim/catalog/kernel_calibration.toml
        cal = cost.cal
        self.flop_rate = gpu.flops_16bit * min(cal.compute_eff_prefill, cal.compute_eff_decode)
        self.byte_rate = gpu.hbm_bandwidth * cal.bandwidth_eff

    def seconds(self, tokens: int, adapters: int) -> float:
        """`tokens` tokens of requests with adapters, `adapters` of them distinct."""
        if tokens <= 0 or adapters <= 0:
            return 0.0
        compute = self.flops_token * tokens / self.flop_rate
        memory = (self.slot_bytes * adapters + self.act_bytes_token * tokens) / self.byte_rate
        return max(compute, memory) + self.kernels * self.fixed_s


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
    from sim.catalog.links import get_link

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

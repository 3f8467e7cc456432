"""What LoRA adapters cost: their sizes per GPU, the slots' memory, a step's shrink and expand kernels."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.config.calibration import KernelCalibration
from sim.config.lora import LoraConfig
from sim.cost.memory import KvMemory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError

ROW_PARALLEL = frozenset({"o_proj", "down_proj"})


# vLLM runs one shrink and one expand kernel per LoRA layer; q/k/v and gate/up are packed layers.
PACKED = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


# Host link of each catalogue GPU (sim/catalog/links.toml); a policy's `host_link` overrides it.
HOST_LINK = {"A100-40GB": "pcie-gen4-x16", "A100-80GB": "pcie-gen4-x16", "H100-SXM": "pcie-gen5-x16",
             "H100-PCIe": "pcie-gen5-x16", "H200": "pcie-gen5-x16", "B200": "pcie-gen5-x16",
             "L4": "pcie-gen4-x16", "L40S": "pcie-gen4-x16", "A10G": "pcie-gen4-x16", "T4": "pcie-gen3-x16",
             "MI300X": "pcie-gen5-x16"}  # fmt: skip


LORA_BYTES = 2  # adapters are served in the model's 16-bit dtype (vLLM's lora_dtype "auto")


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


class LoraCost:
    """Seconds of a step's LoRA kernels (shrink and expand per LoRA layer, over the whole batch).

    vLLM's: every LoRA-capable module at the slots' rank, q/k/v and gate/up packed into one kernel each.
    `modules` (the adapters' own, at their rank) and `packed = False` (a shrink and an expand per module)
    cost S-LoRA's MBGMM/MBGMV kernels, which gather each row's adapter from the pool."""

    def __init__(
        self, model: ModelSpec, gpu: Gpu, tp: int, max_lora_rank: int, cost: CostModel,
        modules: Iterable[str] | None = None, packed: bool = True,
    ) -> None:  # fmt: skip
        shapes = module_shapes(model)
        names = list(shapes) if modules is None else list(modules)
        widths = [per_gpu_widths(model, n, shapes[n], tp) for n in names]
        layers, r = model.num_layers, max_lora_rank
        self.flops_token = 2.0 * layers * r * sum(a + b for a, b in widths)  # shrink + expand FLOPs
        # activations: shrink reads x; expand reads the r-wide buffer and reads and writes y
        self.act_bytes_token = LORA_BYTES * layers * sum(a + r + 2 * b for a, b in widths)
        self.slot_bytes = slot_bytes(model, r, tp) if modules is None else adapter_bytes(model, r, names, tp)
        groups = sum(1 for group in PACKED if any(m in names for m in group)) if packed else len(names)
        self.kernels = 2 * layers * groups
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

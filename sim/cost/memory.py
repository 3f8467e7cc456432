"""KV-cache capacity of one replica: memory for weights, a reserve, and KV blocks.

The seed identity: max concurrent sequences = KV bytes available / KV bytes per token / sequence length
(in whole blocks of `block_size` tokens, as vLLM allocates them).

Reserve rule (vLLM-like profile of the non-KV memory besides weights), fitted to the KV block counts
of real vLLM runs on H100 (reference/ground-truth/calibration-experiments.csv, 8 runs: within 1.5%):
  0.15 GiB                                      CUDA context, cuBLAS workspaces, allocator slack
  + profile_tokens x 2 B x (hidden + 2 x MLP width / tp)   activation peak of the profile forward pass
  + 256 x vocab x 32 B                           sampler: fp32 logits/probs and sort buffers for 256 seqs
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.catalog.dtypes import dtype_bytes, normalize_dtype
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.config.sections import ModelSection
from sim.io.errors import SimError

GB = 1e9
DEFAULT_MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
FIXED_RESERVE = int(0.15 * 2**30)
PROFILE_TOKENS = 2048  # vLLM's default max_num_batched_tokens for online serving
SAMPLER_SEQS = 256  # vLLM's default max_num_seqs
SAMPLER_BYTES_PER_VOCAB = 32  # per sequence: ~8 fp32-sized buffers per logit


@dataclass(frozen=True)
class KvMemory:
    """Memory budget of one GPU of a replica (all byte counts per GPU)."""

    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    gpu_memory_utilization: float
    memory_bytes: int  # device total reported by the driver
    budget_bytes: int  # memory_bytes x gpu_memory_utilization
    weight_bytes: int
    reserve_bytes: int
    kv_bytes_available: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    num_blocks: int
    weight_group_size: int | None = None  # online int4/int8 weights: weights per 16-bit scale

    @property
    def token_capacity(self) -> int:
        """Tokens the KV cache holds (whole blocks)."""
        return self.num_blocks * self.block_size

    def blocks_per_seq(self, length: int) -> int:
        """Blocks one sequence of `length` tokens occupies."""
        return math.ceil(length / self.block_size)

    def max_seqs(self, length: int) -> int:
        """Sequences of `length` tokens that fit at once."""
        return self.num_blocks // max(1, self.blocks_per_seq(length))

    @property
    def max_blocks(self) -> int:
        """KV blocks the budget holds after the weights alone: no run, however little it reserves, has more"""
        return max(0, self.budget_bytes - self.weight_bytes) // self.block_bytes

    def to_dict(self) -> dict[str, object]:
        """Plain dict with integer byte counts (weight_group_size only when set)."""
        out = {**asdict(self), "token_capacity": self.token_capacity}
        if self.weight_group_size is None:
            del out["weight_group_size"]
        return out


def reserve_bytes(model: ModelSpec, tp: int = 1) -> int:
    """Non-KV, non-weight memory per GPU (see the module docstring)."""
    linear_per_layer = model.linear_flops_per_token / 2 - model.attention_params
    mlp_width = linear_per_layer / model.num_layers / (3 * model.hidden_size)
    activation = PROFILE_TOKENS * 2 * (model.hidden_size + 2 * mlp_width / tp)
    sampler = SAMPLER_SEQS * model.vocab_size * SAMPLER_BYTES_PER_VOCAB
    return int(FIXED_RESERVE + activation + sampler)


def replica_kv_memory(section: ModelSection, model: ModelSpec, gpu: Gpu, source: str) -> KvMemory:
    """The KV memory of one replica of a scenario's [model] table (`source` names it in errors)."""
    m = section
    try:
        return kv_memory(model, gpu, m.tp, m.gpu_memory_utilization, m.weight_dtype, m.kv_dtype, m.block_size,
                         m.weight_group_size)  # fmt: skip
    except SimError as err:
        raise SimError(f"{source}: model: {err}") from None


def check_kv_blocks(mem: KvMemory, blocks: int) -> None:
    """SimError when `blocks` KV blocks (a given num_kv_blocks) need more memory than the GPU has left."""
    if blocks <= mem.max_blocks:
        return
    left = mem.budget_bytes - mem.weight_bytes
    raise SimError(
        f"{blocks:,} blocks of {mem.block_bytes:,} bytes ({blocks * mem.block_bytes / GB:,.1f} GB per GPU) "
        f"exceed the {left / GB:.1f} GB the {mem.gpu} x{mem.tp} has left for KV "
        f"({mem.gpu_memory_utilization:g} x {mem.memory_bytes / GB:.1f} GB, less "
        f"{mem.weight_bytes / GB:.1f} GB of weights): at most {mem.max_blocks:,} fit "
        f"({mem.num_blocks:,} after the activation reserve, the count used when num_kv_blocks is left out)"
    )


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, kv_dtype: str) -> int:
    """KV bytes per token on one GPU: KV heads sharded over tp (one head at least); MLA replicated."""
    return int(model.num_layers * model.kv_layer_bytes_per_gpu(tp, kv_dtype))


def check_tp(model: ModelSpec, tp: int) -> None:
    if tp < 1 or model.num_heads % tp:
        raise SimError(
            f"tensor parallel degree {tp} must divide the {model.num_heads} attention heads of {model.name}"
        )


def _usable(model: ModelSpec, gpu: Gpu, tp: int, util: float, wdtype: str) -> float:
    """Bytes left for KV per GPU (negative when weights and reserve do not fit)."""
    budget = gpu.memory_bytes * util
    return budget - model.weight_bytes_per_gpu(tp, wdtype) - reserve_bytes(model, tp)


def _suggest(model: ModelSpec, gpu: Gpu, tp: int, util: float, wdtype: str) -> str:
    tps = [t for t in (2, 4, 8, 16) if t > tp and model.num_heads % t == 0]
    fit_tp = next((t for t in tps if _usable(model, gpu, t, util, wdtype) > 0), None)
    smaller = [d for d in ("fp8", "int8", "int4") if dtype_bytes(d) < dtype_bytes(wdtype)]
    fit_dt = [d for d in smaller if _usable(model, gpu, tp, util, d) > 0]
    hints = []
    if fit_tp:
        hints.append(f"--tp {fit_tp}")
    if fit_dt:
        hints.append(f"--weight-dtype {fit_dt[0]}")
    return (
        f"; it fits with {' or '.join(hints)}" if hints else "; no TP degree up to 16 or dtype makes it fit"
    )


def kv_memory(
    model: ModelSpec,
    gpu: Gpu,
    tp: int = 1,
    gpu_memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    block_size: int = 16,
    weight_group_size: int | None = None,
) -> KvMemory:
    """Split one GPU's memory into weights, reserve and KV blocks; SimError if weights do not fit."""
    if not 0 < gpu_memory_utilization <= 1:
        raise SimError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise SimError(f"block_size must be >= 1, got {block_size}")
    check_tp(model, tp)
    wdt = normalize_dtype(weight_dtype or model.default_weight_dtype)
    kvdt = normalize_dtype(kv_dtype or model.torch_dtype)
    budget = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = int(model.weight_bytes_per_gpu(tp, wdt, weight_group_size))
    reserve = reserve_bytes(model, tp)
    available = budget - weights - reserve
    per_token = kv_bytes_per_token_per_gpu(model, tp, kvdt)
    block_bytes = per_token * block_size
    if available < block_bytes:
        short = (block_bytes - available) / GB
        raise SimError(
            f"{model.name} does not fit on {gpu.name} x{tp} at {wdt}: weights {weights / GB:.1f} GB"
            f" + reserve {reserve / GB:.1f} GB per GPU exceed the {budget / GB:.1f} GB usable"
            f" ({gpu_memory_utilization:g} x {gpu.memory_bytes / GB:.1f} GB) by {short:.1f} GB"
            + _suggest(model, gpu, tp, gpu_memory_utilization, wdt)
        )
    return KvMemory(
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        weight_dtype=wdt,
        kv_dtype=kvdt,
        gpu_memory_utilization=gpu_memory_utilization,
        memory_bytes=gpu.memory_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes_available=available,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        block_bytes=block_bytes,
        num_blocks=available // block_bytes,
        weight_group_size=weight_group_size,
    )


# ----------------------------------------------------------------------------- report (`sim capacity`)


@dataclass(frozen=True, slots=True)
class KvBudget:
    """The KV memory a replica gives its scheduler, in blocks of `block_size` token slots."""

    num_blocks: int
    block_size: int
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

"""Where a replica's GPUs go beyond TP: the placement's keys (`Placement`: `tp x pp x dp` GPUs, experts over
`ep` ranks, the links and options of EP), the checks vLLM makes of it, and the memory of its busiest GPU.

Placement (vLLM's rules): a replica is `pp` pipeline stages of `tp x dp` GPUs. The model's layers split
across stages as vLLM's `get_pp_indices` splits them (the remainder to the stages before the last). Dense
weights shard over `tp`; the routed experts over all `tp x dp` GPUs of a stage, by tensor or, with `ep = tp x
dp` (vLLM's `--enable-expert-parallel`), by expert: the bytes per GPU are the same either way. Each of the
`dp` attention ranks holds the KV of its own requests for its stage's layers. What each costs a step:
sim/cost/parallel.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.catalog.dtypes import normalize_dtype
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.cost.memory import GB, check_tp, reserve_bytes
from sim.io.errors import SimError


@dataclass(frozen=True, slots=True)
class Placement:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    nodes: int | None = None
    gpus_per_node: int = 8
    expert_skew: float = 0.0
    intra_node_link: str = "nvlink-4"
    inter_node_link: str = "infiniband-ndr"
    two_batch_overlap: bool = False
    ep_dispatch_dtype: str = "bf16"
    ep_all_to_all: str = "per_expert"
    ep_redundant_experts: int = 0

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def node_count(self) -> int:
        return self.nodes if self.nodes is not None else math.ceil(self.gpus / self.gpus_per_node)

    @property
    def beyond_tp(self) -> bool:
        """True unless the placement is plain TP on one node (the single-replica cost as before)."""
        extra = self.two_batch_overlap or self.ep_redundant_experts > 0
        return (self.pp, self.ep, self.dp) != (1, 1, 1) or extra

    def physical_experts(self, model: ModelSpec) -> int:
        """Expert slots over the EP group: the routed experts and EPLB's redundant ones."""
        return model.num_experts + self.ep_redundant_experts


def group_placement(group: Any, tp: int) -> Placement:
    """The placement of a `[[cluster.groups]]` table at TP degree `tp`."""
    return Placement(tp, group.pp, group.ep, group.dp, group.nodes, group.gpus_per_node, group.expert_skew,
                     group.intra_node_link, group.inter_node_link, group.two_batch_overlap,
                     group.ep_dispatch_dtype, group.ep_all_to_all, group.ep_redundant_experts)  # fmt: skip


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's `get_pp_indices`: even split, the remainder to the stages
    before the last (the last also computes the head)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def check_placement(model: ModelSpec, p: Placement, where: str, sep: str = ".") -> None:
    """SimError naming the key (`where` + `sep` + key) when vLLM would refuse the placement for this model."""
    try:
        check_tp(model, p.tp)
    except SimError as err:
        raise SimError(f"{where}{sep}tp: {err}") from None
    if p.pp > model.num_layers:
        raise SimError(f"{where}{sep}pp: {p.pp} stages exceed the {model.num_layers} layers of {model.name}")
    if p.ep > 1:
        if not model.num_experts:
            raise SimError(f"{where}{sep}ep: {model.name} is dense (no experts to place); use ep = 1")
        if p.ep != p.tp * p.dp:
            raise SimError(
                f"{where}{sep}ep: vLLM's expert-parallel size is tp x dp = {p.tp * p.dp}, got {p.ep}"
            )
        if p.physical_experts(model) % p.ep:
            extra = f" + {p.ep_redundant_experts} redundant" if p.ep_redundant_experts else ""
            raise SimError(
                f"{where}{sep}ep: {p.ep} must divide the {model.num_experts}{extra} experts of {model.name}"
                " (vLLM spreads the physical experts evenly; ep_redundant_experts adds some)"
            )
    if p.dp > 1 and not model.num_experts:  # vLLM steps DP ranks together only for the MoE layers
        raise SimError(
            f"{where}{sep}dp: {model.name} is dense: vLLM runs its DP ranks as independent engines, which "
            "replicas model (`count` in a [[cluster.groups]] table); dp > 1 is DP attention for MoE models"
        )
    if p.ep_redundant_experts and p.ep == 1:
        key = "ep_redundant_experts" if sep else "redundant-experts"
        raise SimError(f"{where}{sep}{key}: EPLB's redundant experts need ep > 1 (vLLM: EPLB needs EP)")
    if p.two_batch_overlap and p.ep == 1:
        key = "two_batch_overlap" if sep else "two-batch-overlap"  # the scenario key, or the CLI option
        raise SimError(f"{where}{sep}{key}: overlaps the EP all-to-all; it needs ep > 1")
    if p.nodes is not None and p.gpus > p.nodes * p.gpus_per_node:
        raise SimError(f"{where}{sep}nodes: {p.gpus} GPUs exceed {p.nodes} x {p.gpus_per_node}")


@dataclass(frozen=True, slots=True)
class RankMemory:
    """Memory of the busiest GPU of a placement (the first stage with the most layers)."""

    layers: int
    weight_bytes: int
    reserve_bytes: int
    budget_bytes: int
    kv_bytes_per_token: int  # on this rank: its stage's layers, its KV-head shard
    kv_tokens_per_rank: int  # tokens one attention rank holds
    kv_tokens: int  # tokens the replica holds: dp ranks, each its own requests

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers_per_stage": self.layers, "weights_gb": round(self.weight_bytes / GB, 3),
            "reserve_gb": round(self.reserve_bytes / GB, 3), "budget_gb": round(self.budget_bytes / GB, 3),
            "kv_bytes_per_token_per_rank": self.kv_bytes_per_token,
            "kv_tokens_per_rank": self.kv_tokens_per_rank, "kv_tokens": self.kv_tokens,
        }  # fmt: skip


def rank_memory(
    model: ModelSpec, gpu: Gpu, p: Placement, util: float, weight_dtype: str | None, kv_dtype: str | None,
    block_size: int, where: str, group_size: int | None = None, sep: str = ".",
) -> RankMemory:  # fmt: skip
    """Per-GPU weights, reserve and KV of the placement; SimError naming `where.pp` if they do not fit."""
    wdt = normalize_dtype(weight_dtype or model.default_weight_dtype)
    kvdt = normalize_dtype(kv_dtype or model.torch_dtype)
    layers = max(stage_layers(model.num_layers, p.pp))
    frac = layers / model.num_layers
    total = model.weight_bytes(wdt, group_size)
    experts = model.routed_expert_params * model.param_bytes("experts", wdt, group_size)
    held = experts  # each rank holds (E + R) / ep experts: the redundant ones are copies
    if p.ep_redundant_experts:
        held = experts * p.physical_experts(model) / model.num_experts
    shard = model.shard_bytes(total - experts, p.tp, wdt, group_size)  # MLA's down-projections whole
    weights = int((shard + held / (p.tp * p.dp)) * frac)
    reserve = reserve_bytes(model, p.tp)
    budget = int(gpu.memory_bytes * util)
    per_token = int(layers * model.kv_layer_bytes_per_gpu(p.tp, kvdt))
    left = budget - weights - reserve
    if left < per_token * block_size:
        raise SimError(
            f"{where}{sep}pp: {model.name} does not fit on {gpu.name} at tp {p.tp} x pp {p.pp} x dp {p.dp}: "
            f"{weights / GB:.1f} GB of weights + {reserve / GB:.1f} GB reserve per GPU exceed the "
            f"{budget / GB:.1f} GB usable"
        )
    per_rank = left // (per_token * block_size) * block_size
    return RankMemory(layers, weights, reserve, budget, per_token, per_rank, per_rank * p.dp)

"""One replica's cost model and KV budget, from a scenario's model table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.catalog.gpu_formats import check_formats, served_model
from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.catalog.quantisation import checkpoint_format_problem, quantisation_info
from sim.config.calibration import Calibration
from sim.config.scenario import Scenario
from sim.cost.memory import KvBudget, check_kv_blocks, replica_kv_memory
from sim.cost.parallel import Placement, check_placement, rank_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError


def calibration_for(scenario: Scenario) -> Calibration:
    """The shipped calibration with the scenario's overrides (keys and ranges checked when it was read)."""
    return replace(Calibration.load(), **scenario.calibration)


def build_cost_and_memory(
    scenario: Scenario, source: str = "scenario", placement: Placement | None = None, where: str = ""
) -> tuple[CostModel, KvBudget, dict[str, Any]]:
    """The replica's cost model and KV budget, and the memory figures for the summary; a `placement`
    beyond TP (sim/cost/parallel.py, its keys under `where`) takes the KV budget of its ranks."""
    m = scenario.model
    try:
        model = load_model(m.name)
    except SimError as err:
        raise SimError(f"{source}: model.name: {err}") from None
    try:
        gpu = get_gpu(m.gpu)
    except SimError as err:
        raise SimError(f"{source}: model.gpu: {err}") from None
    check_formats(
        gpu, m.weight_dtype, m.kv_dtype, (f"{source}: model.weight_dtype", f"{source}: model.kv_dtype")
    )
    try:
        model = served_model(model, gpu)
    except SimError as err:
        raise SimError(f"{source}: model.gpu: {err}") from None
    why = checkpoint_format_problem(model, m.weight_dtype)
    if why is not None:
        raise SimError(f"{source}: model.weight_dtype: {why}")
    try:
        model.check_length(m.max_model_len)
    except SimError as err:
        raise SimError(f"{source}: model.max_model_len: {err}") from None
    gs = m.weight_group_size
    cost = CostModel(model, gpu, m.tp, m.weight_dtype, m.kv_dtype, calibration_for(scenario), gs)
    if placement is not None and placement.beyond_tp:
        return placed_cost_and_memory(cost, scenario, placement, where or source)
    mem = replica_kv_memory(m, model, gpu, source)
    blocks = m.num_kv_blocks if m.num_kv_blocks is not None else mem.num_blocks
    try:
        check_kv_blocks(mem, blocks)
    except SimError as err:
        raise SimError(f"{source}: model.num_kv_blocks: {err}") from None
    info = {
        "model": m.name,
        "gpu": gpu.name,
        "tp": m.tp,
        "kv_blocks": blocks,
        "block_size": m.block_size,
        "kv_tokens": blocks * m.block_size,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
    }
    if m.weight_dtype or m.kv_dtype or model.quant.dtype:  # quantized: the formats (16-bit runs unchanged)
        info.update(quantisation_info(cost, mem))
    return cost, KvBudget(blocks, m.block_size, m.max_model_len), info


def placed_cost_and_memory(
    cost: CostModel, scenario: Scenario, p: Placement, where: str
) -> tuple[CostModel, KvBudget, dict[str, Any]]:
    """The KV budget of a placement beyond TP: each of its dp attention ranks holds its own requests' KV."""
    m, model = scenario.model, cost.model
    check_placement(model, p, where)
    mem = rank_memory(model, cost.gpu, p, m.gpu_memory_utilization, m.weight_dtype, m.kv_dtype, m.block_size,
                      where, m.weight_group_size)  # fmt: skip
    blocks = mem.kv_tokens // m.block_size
    if m.num_kv_blocks is not None:  # given: the replica's blocks, all its attention ranks together
        if m.num_kv_blocks > blocks:
            raise SimError(
                f"{where}: model.num_kv_blocks: {m.num_kv_blocks:,} blocks exceed the {blocks:,} that the "
                f"placement's {p.dp} attention rank(s) hold after weights and reserve"
            )
        blocks = m.num_kv_blocks
    info = {
        "model": m.name, "gpu": cost.gpu.name, "tp": p.tp, "pp": p.pp, "ep": p.ep, "dp": p.dp,
        "nodes": p.node_count, "kv_blocks": blocks, "block_size": m.block_size,
        "kv_tokens": blocks * m.block_size, "kv_bytes_per_token": mem.kv_bytes_per_token,
        "per_rank": mem.to_dict(),
    }  # fmt: skip
    return cost, KvBudget(blocks, m.block_size, m.max_model_len), info

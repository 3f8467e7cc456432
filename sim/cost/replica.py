"""One replica's cost model and KV budget, from a scenario's model table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim.catalog.engines import DEFAULT_ENGINE, get_engine
from sim.catalog.gpu_formats import check_formats, served_model
from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.catalog.quantisation import checkpoint_format_problem, quantisation_info
from sim.config.calibration import Calibration
from sim.config.scenario import Scenario
from sim.cost.engine_profile import ProfiledCost
from sim.cost.memory import KvBudget, check_kv_blocks, replica_kv_memory
from sim.cost.placement import Placement, check_placement, rank_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError


def calibration_for(scenario: Scenario) -> Calibration:
    """The shipped calibration with the scenario's overrides (keys and ranges checked when it was read)."""
    return replace(Calibration.load(), **scenario.calibration)


def build_cost_and_memory(
    scenario: Scenario,
    source: str = "scenario",
    placement: Placement | None = None,
    where: str = "",
    engine: str = DEFAULT_ENGINE,
) -> tuple[CostModel, KvBudget, dict[str, Any]]:
    """The replica's cost model and KV budget, and the memory figures for the summary; a `placement`
    beyond TP (sim/cost/placement.py, its keys under `where`) takes the KV budget of its ranks. `engine`
    other than today's costs the steps with that engine's profile (`profiled_cost`)."""
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
    if not m.allow_long_max_model_len:
        try:
            model.check_length(m.max_model_len)
        except SimError as err:
            raise SimError(
                f"{source}: model.max_model_len: {err}; set model.allow_long_max_model_len = true to serve "
                "it anyway, as VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 does"
            ) from None
    gs = m.weight_group_size
    if engine == DEFAULT_ENGINE:
        cal = calibration_for(scenario)
        cost: CostModel = CostModel(model, gpu, m.tp, m.weight_dtype, m.kv_dtype, cal, gs)
    else:
        cost = profiled_cost(scenario, model, gpu, engine, source)
    if placement is not None and placement.beyond_tp:
        if engine != DEFAULT_ENGINE:
            raise SimError(f"{where or source}: engine {engine!r}: a profile costs tensor parallelism only "
                           "(pp, ep and dp at 1)")  # fmt: skip
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
    if engine != DEFAULT_ENGINE:
        info["engine"] = engine
    if m.weight_dtype or m.kv_dtype or model.quant.dtype:  # quantized: the formats (16-bit runs unchanged)
        info.update(quantisation_info(cost, mem))
    return cost, KvBudget(blocks, m.block_size, m.max_model_len), info


def profiled_cost(scenario: Scenario, model: Any, gpu: Any, engine: str, source: str) -> ProfiledCost:
    """The replica's cost model on `engine`'s profile: the fit for this model, GPU and tp if the profile has
    one, else the transfer rule from the fit `reference_for` names (sim/cost/engine_profile.py). Quantized
    formats are refused (as are placements beyond TP, above): no profile measured them."""
    m = scenario.model
    if m.weight_dtype or m.kv_dtype or model.quant.dtype or m.weight_group_size:
        raise SimError(f"{source}: model.weight_dtype: engine {engine!r}: a profile costs 16-bit weights "
                       "and KV only (no profile measured a quantized format)")  # fmt: skip
    profile, cal = get_engine(engine), calibration_for(scenario)
    fit = profile.fit_for(model.name, gpu.name, m.tp)
    reference = None
    if fit is None:
        fit = profile.reference_for(model.name, m.tp)
        reference = CostModel(served_model(load_model(fit.model), get_gpu(fit.gpu)), get_gpu(fit.gpu), fit.tp,
                              calibration=cal)  # fmt: skip
    return ProfiledCost(model, gpu, m.tp, None, None, cal, None, fit=fit, engine=engine, reference=reference)


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

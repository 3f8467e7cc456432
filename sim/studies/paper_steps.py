"""`sim papers`' step-cost cells (`step_time`, `request_time`): the step times a policy of the scenario pays,
as a run charges them (`build_cost_and_memory` with the policy's engine), in milliseconds. Nothing is run.

A token step is timed as the mean over the decode steps after a prompt: the step that emits a request's
k-th token (k = 2 … output) holds `prompt + k - 2` cached tokens per sequence. A request served alone has its
prompt step as TTFT, the mean token step as TBT (TPOT), and TTFT + (output − 1) × TBT as E2E. A cell's `gpu`
replaces the scenario's `model.gpu`; with `over_gpu` the figure is over the same one on that GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.catalog.engines import DEFAULT_ENGINE
from sim.config.papers import Cell
from sim.config.scenario import Scenario, load_scenario
from sim.cost.replica import build_cost_and_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError


def prompt_ms(cost: CostModel, batch: int, prompt: int) -> float:
    """One prompt step: `batch` prompts of `prompt` tokens, nothing cached."""
    return cost.step(np.full(batch, prompt), np.zeros(batch, dtype=np.int64)).seconds * 1e3


def token_ms(cost: CostModel, batch: int, prompt: int, output: int) -> float:
    """The mean decode step of `batch` sequences over the `output - 1` steps after a `prompt`-token prompt."""
    ones = np.ones(batch, dtype=np.int64)
    steps = [cost.step(ones, np.full(batch, prompt + k)).seconds for k in range(output - 1)]
    return float(np.mean(steps)) * 1e3


def step_value(cell: Cell, cost: CostModel) -> float:
    """A step-cost cell's figure (ms) on `cost`."""
    assert cell.prompt is not None
    if cell.figure == "step_time" and cell.phase == "prompt":
        return prompt_ms(cost, cell.batch, cell.prompt)
    assert cell.output is not None
    tbt = token_ms(cost, cell.batch, cell.prompt, cell.output)
    if cell.figure == "step_time" or cell.metric == "tpot":
        return tbt
    ttft = prompt_ms(cost, 1, cell.prompt)
    return ttft if cell.metric == "ttft" else ttft + (cell.output - 1) * tbt


def policy_cost(scenario: Scenario, policy: str, source: str) -> CostModel:
    """The cost model `policy` of `scenario` pays on its replica (today's engine unless it names one)."""
    if policy not in scenario.policies:
        raise SimError(f"{source}: no policy {policy!r} (policies: {', '.join(sorted(scenario.policies))})")
    _, config = scenario.policy(policy)
    engine = getattr(config, "engine", DEFAULT_ENGINE)
    cost, _, _ = build_cost_and_memory(scenario, source, engine=engine)
    return cost


def step_values(cells: list[Cell], scenario_path: Path) -> list[float]:
    """Each step-cost cell's figure, in order, one cost model per policy and GPU."""
    costs: dict[tuple[str, str | None], CostModel] = {}

    def cost_on(cell: Cell, gpu: str | None) -> CostModel:
        (policy,) = cell.policies
        if (policy, gpu) not in costs:
            scenario = load_scenario(scenario_path, None if gpu is None else [f"model.gpu={gpu}"])
            where = f"{scenario_path}, cell {cell.name!r}" + ("" if gpu is None else f" (gpu {gpu!r})")
            costs[policy, gpu] = policy_cost(scenario, policy, where)
        return costs[policy, gpu]

    values: list[float] = []
    for cell in cells:
        value = step_value(cell, cost_on(cell, cell.gpu))
        if cell.over_gpu is not None:
            value /= step_value(cell, cost_on(cell, cell.over_gpu))
        values.append(value)
    return values

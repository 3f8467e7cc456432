"""How large a run will be, estimated before it starts, and the check that refuses one past the limits.

The estimate: requests = arrival rate x horizon.duration_s (staged: the stages' sum; a trace: its rows
before the horizon; closed loop: each user's cycles of think time plus one step per output token), capped by
horizon.max_requests; tokens = requests x (mean prompt + mean output x n). A run over `RUN_MAX_REQUESTS`
requests, `RUN_MAX_TOKENS` tokens or `MAX_KV_BLOCKS` KV blocks in a replica is refused unless forced.

A fleet (`[cluster]`) serves the same request stream; each group's replicas have their own GPU, TP and so KV
blocks. An idle replica holds no block (its pool is made at its first request), so the fleet's blocks are
those of the replicas its requests can reach: in each group, at most one replica per request. Past
`RUN_MAX_KV_BLOCKS` of them, the run is refused unless forced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.config.lengths import mean_of
from sim.config.scenario import Scenario, apply_overrides, parse_override, read_toml, validate_scenario
from sim.config.workload import DEFAULT_MAX_TOKENS, WorkloadConfig
from sim.cost.placement import group_placement
from sim.cost.replica import build_cost_and_memory
from sim.io.errors import SimError
from sim.io.limits import MAX_KV_BLOCKS, RUN_MAX_KV_BLOCKS, RUN_MAX_REQUESTS, RUN_MAX_TOKENS
from sim.workload.generator import Workload
from sim.workload.traces import TraceProcess


@dataclass(frozen=True, slots=True)
class RunSize:
    """Expected requests and tokens of one run, the KV blocks of its largest replica, and for a fleet its
    replicas and the KV blocks of those its requests can reach (a single replica: 1 and its blocks)."""

    requests: float
    tokens: float
    kv_blocks: int
    replicas: int = 1
    fleet_kv_blocks: int | None = None

    def excess(self) -> list[str]:
        """What exceeds the limits, in words; empty when the run is within them."""
        out = []
        if self.requests > RUN_MAX_REQUESTS:
            out.append(f"about {_count(self.requests)} requests (limit {RUN_MAX_REQUESTS:,})")
        if self.tokens > RUN_MAX_TOKENS:
            out.append(f"about {_count(self.tokens)} tokens (limit {RUN_MAX_TOKENS:,})")
        if self.kv_blocks > MAX_KV_BLOCKS:
            out.append(f"{self.kv_blocks:,} KV blocks (limit {MAX_KV_BLOCKS:,})")
        if self.fleet_kv_blocks is not None and self.fleet_kv_blocks > RUN_MAX_KV_BLOCKS:
            out.append(
                f"{self.fleet_kv_blocks:,} KV blocks in the replicas its requests reach, of {self.replicas:,}"
                f" (limit {RUN_MAX_KV_BLOCKS:,})"
            )
        return out


def _count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e15 else f"{x:.2g}"


def request_lengths(w: WorkloadConfig, trace: TraceProcess | None, base_dir: Path) -> tuple[float, float]:
    """Mean prompt and mean output tokens (all n sequences) of one request."""
    prefix = w.prefix.prefix_len if w.prefix is not None else 0
    prompt = trace.column_mean("prompt") if trace is not None else None
    if prompt is None:
        prompt = prefix + (mean_of(w.prompt, base_dir) if w.prompt is not None else 0.0)
    traced_output = trace.column_mean("output") if trace is not None else None
    max_tokens = float(w.max_tokens or traced_output or DEFAULT_MAX_TOKENS)
    if w.ignore_eos:
        output = max_tokens
    elif traced_output is not None:
        output = min(traced_output, max_tokens)
    else:
        output = min(mean_of(w.output, base_dir), max_tokens) if w.output is not None else max_tokens
    return prompt, output * w.n


def estimate(scenario: Scenario, base_dir: Path, source: str = "scenario") -> RunSize:
    """The expected size of one run of `scenario` (any of its policies: they share the request stream)."""
    w, h = scenario.workload, scenario.horizon
    arrival = w.arrival
    duration = math.inf if h.duration_s is None else h.duration_s
    cap = math.inf if h.max_requests is None else float(h.max_requests)
    trace = Workload(w, 0, base_dir).trace if arrival.kind == "trace" else None
    prompt, output = request_lengths(w, trace, base_dir)
    group = scenario.cluster.groups[0] if scenario.cluster is not None else None
    if scenario.cluster is not None:  # imported here: a one-replica run does not load the fleet
        from sim.fleet.run import group_scenario
    if group is not None:  # the group's own GPU, TP and placement: its [model] alone may not fit
        placed = group_scenario(scenario, group.gpu, group.tp)
        where = f"{source}: cluster.groups[0]"
        cost, _, info = build_cost_and_memory(placed, where, group_placement(group, placed.model.tp), where)
    else:
        cost, _, info = build_cost_and_memory(scenario, source)
    if arrival.kind in ("poisson", "gamma", "deterministic"):
        requests = arrival.rate * duration  # type: ignore[union-attr]
    elif arrival.kind == "staged":
        requests, t0 = 0.0, 0.0
        for rate, length in arrival.stages:  # type: ignore[union-attr]
            requests += rate * max(0.0, min(length, duration - t0))
            t0 += length
    elif trace is not None:
        requests = float(trace.count_before(duration))
    else:  # closed loop: a user's cycle is at least its think time plus one step per output token
        step, _ = cost.step_time(np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64))
        think = mean_of(arrival.think_time_s, base_dir)  # type: ignore[union-attr]
        cycle = think + output * step
        users = float(arrival.users)  # type: ignore[union-attr]
        requests = users * (1 + duration / cycle) if cycle > 0 else math.inf
    requests = min(requests, cap)
    tokens = requests * (prompt + output)
    if scenario.cluster is None:
        return RunSize(requests, tokens, int(info["kv_blocks"]))
    reached, largest = 0, 0
    for gi, group in enumerate(scenario.cluster.groups):
        where = f"{source}: cluster.groups[{gi}]"
        placed = group_scenario(scenario, group.gpu, group.tp)
        placement = group_placement(group, placed.model.tp)
        _, _, group_info = build_cost_and_memory(placed, where, placement, where)
        blocks = int(group_info["kv_blocks"])
        largest = max(largest, blocks)
        reached += blocks * math.ceil(min(group.count, requests))
    return RunSize(requests, tokens, largest, scenario.cluster.replicas, reached)


def check_run_size(scenario: Scenario, base_dir: Path, source: str, force: bool) -> RunSize:
    """The run's estimated size; SimError stating it and the limits when it is too large, unless `force`."""
    size = estimate(scenario, base_dir, source)
    excess = size.excess()
    if excess and not force:
        raise SimError(
            f"{source}: the run would hold {' and '.join(excess)}; shorten horizon.duration_s, set "
            "horizon.max_requests or lower the load, or pass --force to run it anyway"
        )
    return size


def check_sweep_size(path: Path, overrides: Sequence[str], force: bool) -> None:
    """`check_run_size` for every point of a scenario's sweep grid (bisection points lie between them).

    Only the size is checked here: any other error of the scenario or its grid is left to the sweep.
    """
    # imported here: a `sim run` checks one scenario and needs none of the sweep's grid
    from sim.config.sweep import parse_sweep
    from sim.studies.points import point_scenario

    source = str(path)
    try:
        raw = apply_overrides(read_toml(path), dict(parse_override(o) for o in overrides), source)
        cfg = parse_sweep(validate_scenario(raw, source).sweep, source)
        points = [(params, rate) for params in cfg.param_grid() for rate in cfg.rate_values()]
        scenarios = [(params, rate, point_scenario(raw, rate, params, source)) for params, rate in points]
    except SimError:
        return
    for params, rate, scenario in scenarios:
        try:
            check_run_size(scenario, path.parent, source, force)
        except SimError as err:
            where = ", ".join(f"{k} = {v!r}" for k, v in {**params, "rate": rate}.items() if v is not None)
            raise SimError(f"sweep point ({where}): {err}") from None

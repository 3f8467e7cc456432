"""What `sim plan` searches: GPU prices, the deployments' grid, the work bound that prunes it."""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sim.catalog.gpu_formats import format_problem
from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.scenario import Scenario
from sim.cost.memory import check_tp
from sim.cost.placement import Placement
from sim.cost.replica import build_cost_and_memory
from sim.engine.sampling import sample_as_checkpoint
from sim.fleet.run import group_scenario
from sim.io.errors import SimError
from sim.studies.plan_placements import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_TPS,
    PlacementAxes,
    bottleneck_time,
    check_axes,
    group_keys,
    placement_problem,
    placement_text,
    placements,
    within_node,
)
from sim.studies.plan_routers import (
    DEFAULT_ROUTER,
    ROUTER_KNOB,
    router_unfit,
    routes_alike,
    stands_in,
)
from sim.studies.run_size import request_lengths

THEORY_SLACK = 0.8  # the work bound is an estimate: only counts below 80% of it are pruned


DEFAULT_LINK = "infiniband-ndr"  # prefill and decode replicas on different nodes, unless [cluster] says


MODEL_KNOBS = ("weight_dtype", "kv_dtype")  # knobs of [model] (the formats); the others are the policy's
Knob = tuple[str, int | bool | str]


def tally(removed: dict[str, dict[str, int]] | None, rule: str, c: Candidate, n: int = 1) -> None:
    """Count `n` configurations like `c` as removed by `rule`: in all, and by each axis value they hold."""
    if removed is None:
        return
    counts = removed.setdefault(rule, {})
    values = [f"gpu={c.gpu}", f"tp={c.tp}", *(f"{k}={v}" for k, v in c.knobs)]
    if c.heterogeneous:
        values += [f"decode_gpu={c.decode_gpu}", f"decode_tp={c.decode_tp}"]
    if c.placement.beyond_tp:  # the placement axes' values, beyond plain TP
        values += [f"pp={c.pp}", f"ep={c.ep}", f"dp={c.dp}"]
    for key in ("configurations", *values):
        counts[key] = counts.get(key, 0) + n


@dataclass(frozen=True, slots=True)
class Price:
    usd_per_gpu_hour: float
    source: str
    date: str


def price_table(scenario: Scenario) -> dict[str, Price]:
    """The catalogue's prices with the scenario's [prices] over them (keys: canonical GPU names)."""
    text = (resources.files("sim") / "catalog" / "prices.toml").read_text()
    table = {
        name: Price(float(p["usd_per_gpu_hour"]), str(p["source"]), str(p["date"]))
        for name, p in tomllib.loads(text)["prices"].items()
    }
    for name, usd in scenario.prices.items():
        try:
            canonical = get_gpu(name).name
        except SimError as err:
            raise SimError(f"prices.{name}: {err}") from None
        table[canonical] = Price(usd, "scenario [prices]", "")
    return table


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    """One configuration. `counts` is (replicas,) colocated or (prefill, decode) disaggregated; `gpu` and
    `tp` are every replica's, or the prefill replicas' when `decode_gpu` and `decode_tp` give the decode
    replicas' own (a heterogeneous split; empty and 0 otherwise). `pp`, `ep` and `dp` place each replica
    beyond TP (`plan_placements`; a replica is then `tp x pp x dp` GPUs on nodes of `gpus_per_node`)."""

    cost: float  # $/hour
    gpus: int
    mode: str  # colocated or pd
    gpu: str
    tp: int
    knobs: tuple[Knob, ...]
    counts: tuple[int, ...]
    decode_gpu: str = ""
    decode_tp: int = 0
    pp: int = 1
    ep: int = 1
    dp: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    @property
    def placement(self) -> Placement:
        """Each replica's placement (the prefill replicas' and the decode replicas' alike)."""
        return Placement(self.tp, self.pp, self.ep, self.dp, gpus_per_node=self.gpus_per_node)

    @property
    def heterogeneous(self) -> bool:
        return bool(self.decode_gpu)

    @property
    def family(self) -> tuple[Any, ...]:
        """What stays fixed while the replica counts vary (dominance compares counts within a family)."""
        return (self.mode, self.gpu, self.tp, self.knobs, self.decode_gpu, self.decode_tp, self.pp, self.ep,
                self.dp, self.gpus_per_node)  # fmt: skip

    def label(self) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs)
        tail = placement_text(self.placement) + (f" [{knobs}]" if knobs else "")
        if self.heterogeneous:
            p, d = self.counts
            return f"{p}P x {self.gpu} TP{self.tp} + {d}D x {self.decode_gpu} TP{self.decode_tp}{tail}"
        shape = f"{self.counts[0]}x" if self.mode == "colocated" else f"{self.counts[0]}P+{self.counts[1]}D x"
        return f"{shape} {self.gpu} TP{self.tp}" + tail

    def overrides(self, scenario: Scenario, policy: str) -> dict[str, Any]:
        """The dotted `--set` overrides that turn the scenario into this configuration."""
        out: dict[str, Any] = {"model.gpu": self.gpu, "model.tp": self.tp}
        for key, value in self.knobs:
            if key != ROUTER_KNOB:
                out[f"model.{key}" if key in MODEL_KNOBS else f"policies.{policy}.{key}"] = value
        placed = group_keys(self.placement)
        if self.mode == "colocated":
            out["cluster.groups"] = [{"count": self.counts[0], **placed}]
        else:
            out["cluster.groups"] = [
                {"name": "prefill", "count": self.counts[0], "role": "prefill", **placed},
                {"name": "decode", "count": self.counts[1], "role": "decode", **placed},
            ]
            if self.heterogeneous:
                out["cluster.groups"][0] |= {"gpu": self.gpu, "tp": self.tp}
                out["cluster.groups"][1] |= {"gpu": self.decode_gpu, "tp": self.decode_tp}
        if scenario.cluster is None:
            out["cluster.router"] = DEFAULT_ROUTER
        if ROUTER_KNOB in dict(self.knobs):
            out["cluster.router"] = dict(self.knobs)[ROUTER_KNOB]
        if self.mode == "pd" and "link" not in (scenario.raw.get("cluster") or {}):
            out["cluster.link"] = DEFAULT_LINK
        return out


def knob_grid(scenario: Scenario, policy: str, grid: dict[str, Sequence[Any]]) -> list[tuple[Knob, ...]]:
    """The knob combinations the policy's scheduler (and [model], for the formats) accepts (the scenario's
    own values when the grid gives none)."""
    _, config = scenario.policy(policy)
    fields = set(type(config).model_fields) | set(MODEL_KNOBS) | {ROUTER_KNOB}
    axes: list[list[Knob]] = []
    for key, values in sorted(grid.items()):
        if key in fields and values:
            axes.append([(key, v) for v in values])
    combos: list[tuple[Knob, ...]] = [()]
    for axis in axes:
        combos = [(*c, kv) for c in combos for kv in axis]
    return combos


def unsupported_format(gpu: str, knobs: tuple[Knob, ...]) -> str | None:
    """Why `gpu` cannot run the weight or KV format among `knobs` as vLLM serves it, or None."""
    for key, value in knobs:
        if key in MODEL_KNOBS:
            why = format_problem(get_gpu(gpu), str(value))
            if why is not None:
                return why
    return None


def formatted(scenario: Scenario, gpu: str, tp: int, knobs: tuple[Knob, ...]) -> Scenario:
    """The scenario with one group's GPU and TP, and the formats among `knobs`, in its [model] table."""
    out = group_scenario(scenario, gpu, tp)
    update = {k: v for k, v in knobs if k in MODEL_KNOBS}
    if not update:
        return out
    copy = out.model_copy(update={"model": out.model.model_copy(update=update)})
    copy._policy_configs = out._policy_configs
    return copy


def work_bounds(
    scenario: Scenario,
    policy: str,
    family: tuple[str, str, int, tuple[Knob, ...]],
    rate: float,
    base_dir: Path,
    placement: Placement | None = None,
) -> tuple[int, int, int] | None:
    """Theory's least (colocated, prefill, decode) replica counts at `rate`, or None when the model does
    not fit this GPU and TP (in the formats among the knobs), or a GPU of the `placement` beyond TP. Under
    a placement the replica's work is its slowest stage's (`plan_placements.bottleneck_time`) and its `dp`
    attention ranks prefill `dp` prompts in one step."""
    _, gpu, tp, knobs = family
    try:
        cost, budget, _ = build_cost_and_memory(
            formatted(scenario, gpu, tp, knobs), "plan", placement, "plan"
        )
    except SimError:
        return None
    sample_as_checkpoint(cost, scenario.model.name, scenario.policy(policy)[0], "plan")  # as runs price it
    step = bottleneck_time(cost, placement)
    prompt, output = request_lengths(scenario.workload, None, base_dir)
    p, o = max(1, round(prompt)), max(1.0, output)
    ranks = placement.dp if placement is not None else 1
    t_pre = step(np.full(ranks, p, np.int64), np.zeros(ranks, np.int64)) / ranks
    seqs = dict(knobs).get("max_num_seqs", int(getattr(scenario.policy(policy)[1], "max_num_seqs", 256)))
    batch = max(1, min(seqs, budget.num_tokens // max(1, int(p + o))))
    t_step = step(np.ones(batch, np.int64), np.full(batch, int(p + o / 2), np.int64))
    t_tok = t_step / batch
    bound = lambda work: max(1, math.ceil(THEORY_SLACK * rate * work))  # noqa: E731
    return bound(t_pre + o * t_tok), bound(t_pre), bound(o * t_tok)


def candidates(
    scenario: Scenario,
    policy: str,
    rate: float,
    base_dir: Path,
    gpus: Sequence[str],
    tps: Sequence[int],
    knobs: dict[str, Sequence[Any]],
    max_gpus: int,
    modes: Sequence[str],
    theory: bool = True,
    removed: dict[str, dict[str, int]] | None = None,
    axes: PlacementAxes | None = None,
) -> tuple[list[Candidate], int, int]:
    """Every configuration of the grid that theory does not rule out, cheapest first; the size of the whole
    grid (what brute force would run); and how many of its configurations the model does not fit.

    Modes: `colocated` (c replicas), `pd` (p prefill + d decode replicas of one GPU and TP), `hetero`
    (p prefill replicas on one GPU and TP + d decode replicas on another GPU or TP, within `max_gpus`).
    `theory=False` keeps every configuration that fits in memory (brute force's grid). `removed` is given
    what each rule removed (`tally`): `format_unsupported` (a format the GPU cannot run), `does_not_fit`
    (memory, counted in the third return value) and `theory`; a format the GPU cannot run is neither
    simulated nor counted as not fitting; `router_unfit` and `router_equivalent` (`plan_routers`).
    `axes` adds placements beyond TP to `colocated` and `pd` (`plan_placements`: every replica of a
    configuration placed alike; `hetero` stays plain TP): one vLLM refuses for the model is removed by
    `placement_invalid`, one whose busiest GPU cannot hold its share by `does_not_fit`, and the theory bound
    is its slowest stage's."""
    prices = price_table(scenario)
    _check_tps(scenario, tps)
    axes = axes or PlacementAxes()
    check_axes(scenario, axes, tps)
    tps = within_node(tps, axes)
    out: list[Candidate] = []
    total = unfit = 0
    kinds: list[tuple[str, int, float]] = []  # (GPU, TP, $/GPU-hour)
    for name in gpus:
        gpu = get_gpu(name).name
        if gpu not in prices:
            raise SimError(
                f"--gpus: no price for {gpu}: give one in the scenario, e.g. prices = {{ {gpu!r} = 2.5 }}"
            )
        kinds += [(gpu, tp, prices[gpu].usd_per_gpu_hour) for tp in tps]
    bounds_of: dict[tuple[Any, ...], tuple[int, int, int] | None] = {}
    stand_in = stands_in(scenario, knobs.get(ROUTER_KNOB, []))

    def bounds(
        gpu: str, tp: int, combo: tuple[Knob, ...], place: Placement | None = None
    ) -> tuple[int, int, int] | None:
        key = (gpu, tp, combo, place if place is not None and place.beyond_tp else None)
        if key not in bounds_of:
            found = work_bounds(scenario, policy, ("", gpu, tp, combo), rate, base_dir, key[3])
            bounds_of[key] = found if theory or found is None else (1, 1, 1)
        return bounds_of[key]

    shaped = [(gpu, tp, usd, place) for gpu, tp, usd in kinds for place in placements(tp, axes)]
    for gpu, tp, usd, place in shaped:
        per = max_gpus // place.gpus
        if place.beyond_tp and per == 0:
            continue  # one replica needs more than --max-gpus: not in the grid
        at = {"pp": place.pp, "ep": place.ep, "dp": place.dp, "gpus_per_node": place.gpus_per_node}
        for combo in knob_grid(scenario, policy, knobs):
            shapes: list[tuple[str, tuple[int, ...]]] = []
            if "colocated" in modes:
                shapes += [("colocated", (c,)) for c in range(1, per + 1)]
            if "pd" in modes:
                shapes += [("pd", (p, d)) for p in range(1, per) for d in range(1, per - p + 1)]
            total += len(shapes)
            like = Candidate(0.0, 0, "colocated", gpu, tp, combo, (1,), **at)
            if shapes and placement_problem(scenario, place):
                tally(removed, "placement_invalid", like, len(shapes))
                continue
            if shapes and unsupported_format(gpu, combo):
                tally(removed, "format_unsupported", like, len(shapes))
                continue
            if shapes and router_unfit(scenario, combo):
                tally(removed, "router_unfit", like, len(shapes))
                continue
            found = bounds(gpu, tp, combo, place) if shapes else None
            if found is None:
                unfit += len(shapes)
                tally(removed, "does_not_fit", like, len(shapes))
                continue
            c_min, p_min, d_min = found
            for mode, counts in shapes:
                if routes_alike(combo, counts, stand_in):
                    tally(removed, "router_equivalent", like)
                    continue
                if mode == "colocated" and counts[0] < c_min:
                    tally(removed, "theory", like)
                    continue
                if mode == "pd" and (counts[0] < p_min or counts[1] < d_min):
                    tally(removed, "theory", like)
                    continue
                n = sum(counts) * place.gpus
                out.append(Candidate(round(n * usd, 6), n, mode, gpu, tp, combo, counts, **at))
    if "hetero" in modes:
        for combo in knob_grid(scenario, policy, knobs):
            for (pg, ptp, pusd), (dg, dtp, dusd) in itertools.product(kinds, kinds):
                if (pg, ptp) == (dg, dtp):
                    continue  # the homogeneous split is `pd`
                splits = [
                    (p, d)
                    for p in range(1, (max_gpus - dtp) // ptp + 1)
                    for d in range(1, (max_gpus - p * ptp) // dtp + 1)
                ]
                total += len(splits)
                like = Candidate(0.0, 0, "pd", pg, ptp, combo, (1, 1), dg, dtp)
                if splits and (unsupported_format(pg, combo) or unsupported_format(dg, combo)):
                    tally(removed, "format_unsupported", like, len(splits))
                    continue
                if splits and router_unfit(scenario, combo):
                    tally(removed, "router_unfit", like, len(splits))
                    continue
                pre, dec = bounds(pg, ptp, combo), bounds(dg, dtp, combo)
                if pre is None or dec is None:
                    unfit += len(splits)
                    tally(removed, "does_not_fit", like, len(splits))
                    continue
                for p, d in splits:
                    if routes_alike(combo, (p, d), stand_in):
                        tally(removed, "router_equivalent", like)
                        continue
                    if p < pre[1] or d < dec[2]:
                        tally(removed, "theory", like)
                        continue
                    cost = round(p * ptp * pusd + d * dtp * dusd, 6)
                    out.append(Candidate(cost, p * ptp + d * dtp, "pd", pg, ptp, combo, (p, d), dg, dtp))
    return sorted(out), total, unfit


def _check_tps(scenario: Scenario, tps: Sequence[int]) -> None:
    """SimError for a TP degree that does not divide the model's attention heads, given on purpose (the
    default grid keeps such a degree, counted with those that do not fit)."""
    if tuple(tps) == DEFAULT_TPS:
        return
    try:
        model = load_model(scenario.model.name)
    except SimError:  # reported, with its key, where the replica is built
        return
    for tp in tps:
        try:
            check_tp(model, tp)
        except SimError as err:
            raise SimError(f"--tp: {err}") from None

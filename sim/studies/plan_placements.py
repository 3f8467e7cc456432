"""`sim plan`'s placement axes: pipeline stages, expert parallelism with data-parallel attention, nodes.

A replica of TP degree `tp` is placed as `pp` pipeline stages (`--pp`), each of `tp x dp` GPUs; with
`--ep-dp D` the routed experts of an MoE model are spread by expert over `ep = tp x D` ranks and attention
runs as `D` data-parallel ranks, each with its own KV (vLLM's `--enable-expert-parallel
--data-parallel-size D`). Every placement of the grid is within `--nodes` nodes of `--gpus-per-node` GPUs
(plain TP included: one node of 8 by default); TP stays within a node (a degree past `--gpus-per-node` is
refused: the all-reduce is costed on the node's link). A placement is checked as a scenario's
`[[cluster.groups]]` table is (`GroupSection`, then `sim.cost.placement.check_placement`); its memory per rank
(`rank_memory`) and its step cost (`ParallelCost`) come from the same code a run uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from sim.catalog.models import load_model
from sim.config.cluster import GroupSection
from sim.config.scenario import Scenario
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement, check_placement
from sim.io.errors import SimError

DEFAULT_GPUS_PER_NODE = GroupSection.model_fields["gpus_per_node"].default
DEFAULT_TPS = (1, 2, 4, 8)  # `sim plan --tp`'s default grid
PLACEMENT_COLUMNS = ("pp", "ep", "dp", "nodes")  # a row's placement, when the search has placement axes


@dataclass(frozen=True, slots=True)
class PlacementAxes:
    """The placements searched: pipeline degrees, DP sizes of EP with DP attention, the node bound."""

    pps: tuple[int, ...] = (1,)
    ep_dps: tuple[int, ...] = ()
    nodes: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    @property
    def searched(self) -> bool:
        """True when any axis is off today's default (plain TP, one node of 8): rows then show placements."""
        return self != PlacementAxes()

    def as_dict(self) -> dict[str, Any]:
        return {"pp": list(self.pps), "ep_dp": list(self.ep_dps), "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node}  # fmt: skip


def check_axes(scenario: Scenario, axes: PlacementAxes, tps: Sequence[int]) -> None:
    """SimError for a TP degree past a node, or an axis the model cannot take at any TP: EP on a dense
    model, more stages than layers."""
    wide = [tp for tp in tps if tp > axes.gpus_per_node]
    if wide and tuple(tps) != DEFAULT_TPS:  # the default grid loses them (`within_node`)
        raise SimError(
            f"--tp: {wide[0]} exceeds a node of {axes.gpus_per_node} GPUs (--gpus-per-node); TP stays within "
            "a node: place larger replicas with --pp or --ep-dp and --nodes"
        )
    try:
        model = load_model(scenario.model.name)
    except SimError:  # reported, with its key, where the replica is built
        return
    if axes.ep_dps and not model.num_experts:
        raise SimError(f"--ep-dp: {model.name} is dense (no experts to place); leave --ep-dp out")
    if max(axes.pps) > model.num_layers:
        raise SimError(f"--pp: {max(axes.pps)} stages exceed the {model.num_layers} layers of {model.name}")


def within_node(tps: Sequence[int], axes: PlacementAxes) -> list[int]:
    """The TP degrees that fit a node (`check_axes` refuses the others unless the grid is the default)."""
    return [tp for tp in tps if tp <= axes.gpus_per_node]


def placements(tp: int, axes: PlacementAxes | None) -> list[Placement]:
    """The placements of a replica at TP `tp` within the node bound: each `--pp` degree, plain and with each
    `--ep-dp` size (ep = tp x dp, at least 2)."""
    axes = axes or PlacementAxes()
    out: list[Placement] = []
    for pp in axes.pps:
        out.append(Placement(tp, pp, gpus_per_node=axes.gpus_per_node))
        out += [
            Placement(tp, pp, tp * dp, dp, gpus_per_node=axes.gpus_per_node)
            for dp in axes.ep_dps
            if tp * dp > 1
        ]
    return [p for p in out if p.node_count <= axes.nodes]


def placement_problem(scenario: Scenario, p: Placement) -> str | None:
    """Why a scenario's group could not take this placement (its table's checks, then vLLM's rules for the
    model: heads, layers, experts), or None; plain TP is left to the replica's own checks."""
    if not p.beyond_tp:
        return None
    table = {"tp": p.tp, "pp": p.pp, "ep": p.ep, "dp": p.dp, "gpus_per_node": p.gpus_per_node}
    try:
        GroupSection.model_validate(table)
        check_placement(load_model(scenario.model.name), p, "placement")
    except ValidationError as err:
        return str(err.errors()[0]["msg"])
    except SimError as err:
        return str(err)
    return None


def bottleneck_time(cost: Any, p: Placement | None) -> Callable[[np.ndarray, np.ndarray], float]:
    """Seconds a replica is busy per step, at the least: the step for plain TP; under a placement its
    slowest stage (with `pp` batches in flight the pipeline passes one batch per slowest stage)."""
    if p is None or not p.beyond_tp:
        return lambda c, q: float(cost.step_time(c, q)[0])
    pc = ParallelCost(cost, cost.model, cost.gpu, p)
    return lambda c, q: float(max(pc.stage_seconds(c, q)[0]))


def group_keys(p: Placement) -> dict[str, Any]:
    """The `[[cluster.groups]]` keys that give a group this placement (none for plain TP)."""
    if not p.beyond_tp:
        return {}
    out: dict[str, Any] = {}
    if p.pp > 1:
        out["pp"] = p.pp
    if p.ep > 1:
        out |= {"ep": p.ep, "dp": p.dp}
    if p.gpus_per_node != DEFAULT_GPUS_PER_NODE:
        out["gpus_per_node"] = p.gpus_per_node
    return out


def placement_text(p: Placement) -> str:
    """The placement beyond TP as a label shows it: ' PP2', ' DP4 EP8', ' (2 nodes)'; empty for one node
    of plain TP."""
    parts = [f"PP{p.pp}"] if p.pp > 1 else []
    if p.ep > 1:
        parts += [f"DP{p.dp}", f"EP{p.ep}"] if p.dp > 1 else [f"EP{p.ep}"]
    text = "".join(f" {x}" for x in parts)
    return text + (f" ({p.node_count} nodes)" if p.node_count > 1 else "")

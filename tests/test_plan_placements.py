"""`sim plan --pp --ep-dp --nodes --gpus-per-node`: placements beyond TP in the search, each checked as a
scenario's group is, pruned by memory per rank, theory from its step cost and dominance; its launch lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement
from sim.io.errors import SimError
from sim.studies import plan, plan_space
from sim.studies.plan_options import placement_options
from sim.studies.plan_placements import PlacementAxes

runner = CliRunner()
# Nodes of 4 x L4 (as AWS's g6.12xlarge): Llama-3.1-70B in 16-bit (141 GB of weights) exceeds one node's
# 96 GB.
SCENARIO = """
name = "plan-placements"
seed = 4
prices = { "L4" = 0.8 }
[model]
name = "MODEL"
gpu = "L4"
[workload]
arrival = { kind = "poisson", rate = 0.5 }
prompt = { kind = "lognormal", mean = 300, cv = 0.3, min = 32, max = 800 }
output = { kind = "lognormal", mean = 40, cv = 0.5, min = 4, max = 120 }
max_tokens = 120
[horizon]
duration_s = 20
[slo]
ttft_s = 5.0
tpot_s = 0.5
[policies.vllm]
scheduler = "vllm"
"""
DENSE, MOE = "llama-3.1-70b-instruct", "qwen3-30b-a3b"
L4_NODES = PlacementAxes((1, 2), (), 2, 4)  # PP 1 or 2, within 2 nodes of 4 GPUs


def _scenario(tmp_path: Path, model: str) -> Path:
    path = tmp_path / f"{model}.toml"
    path.write_text(SCENARIO.replace("MODEL", model), encoding="utf-8")
    return path


def _grid(
    path: Path, tps: list[int], axes: PlacementAxes | None, rate: float = 0.5, max_gpus: int = 8
) -> tuple:
    removed: dict[str, dict[str, int]] = {}
    sc = load_scenario(path)
    found = plan_space.candidates(
        sc, "vllm", rate, path.parent, ["L4"], tps, {}, max_gpus, ["colocated"], removed=removed, axes=axes
    )
    return sc, found, removed


def test_dense_model_past_one_node_is_placed_over_two_by_pipeline_stages(tmp_path: Path) -> None:
    """TP 4 alone does not hold the 70B model on a node of 4 L4s; TP 4 x PP 2 over two nodes does, and the
    candidate's overrides make a [[cluster.groups]] table with pp and gpus_per_node."""
    path = _scenario(tmp_path, DENSE)
    sc, (cands, total, unfit), removed = _grid(path, [4], L4_NODES, max_gpus=16)
    assert (total, unfit) == (6, 4)  # 16 GPUs: plain TP 4 x 1-4 replicas (none fits), TP 4 x PP 2 x 1-2
    assert removed["does_not_fit"]["tp=4"] == 4 and "pp=2" not in removed["does_not_fit"]
    assert [c.label() for c in cands] == ["1x L4 TP4 PP2 (2 nodes)", "2x L4 TP4 PP2 (2 nodes)"]
    assert [(c.gpus, c.cost) for c in cands] == [(8, pytest.approx(8 * 0.8)), (16, pytest.approx(16 * 0.8))]
    placed = plan.configured(sc.raw, cands[0].overrides(sc, "vllm"), str(path))
    (group,) = placed.cluster.groups  # type: ignore[union-attr]
    assert (group.count, placed.model.tp, group.pp, group.dp, group.ep, group.gpus_per_node) == (
        1,
        4,
        2,
        1,
        1,
        4,
    )
    # Without the placement axes (today's search) nothing fits: the test holds only with --pp.
    _, (none, _, _), _ = _grid(path, [4], None, max_gpus=16)
    assert none == []


def test_moe_model_gets_expert_parallel_candidates_with_dp_attention_and_invalid_ones_are_named(
    tmp_path: Path,
) -> None:
    """Qwen3-30B-A3B (128 experts, 61 GB) on L4s: TP 1 x DP 4 with EP 4 fits where TP 1 and TP 2 do not;
    DP 3 (ep 3, not dividing 128 experts) is refused as vLLM would refuse it, by `placement_invalid`."""
    path = _scenario(tmp_path, MOE)
    sc, (cands, total, unfit), removed = _grid(path, [1, 2], PlacementAxes((1,), (3, 4)), max_gpus=4)
    labels = [c.label() for c in cands]
    assert labels == ["1x L4 TP1 DP4 EP4"]
    assert removed["placement_invalid"] == {"configurations": 1, "gpu=L4": 1, "tp=1": 1, "pp=1": 1, "ep=3": 1,
                                            "dp=3": 1}  # fmt: skip
    # Within 4 GPUs: plain TP 1 (4 counts) and TP 2 (2 counts) hold 61 GB on no L4; TP 2 x DP 3 or 4 needs
    # more than 4 GPUs, so it is not in the grid.
    assert removed["does_not_fit"] == {"configurations": 6, "gpu=L4": 6, "tp=1": 4, "tp=2": 2} and unfit == 6
    placed = plan.configured(sc.raw, cands[0].overrides(sc, "vllm"), str(path))
    assert placed.model.tp == 1
    assert [(g.ep, g.dp, g.pp) for g in placed.cluster.groups] == [(4, 4, 1)]  # type: ignore[union-attr]
    assert total == sum(v["configurations"] for v in removed.values()) + len(cands)


def test_theory_prunes_placements_by_their_slowest_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a rate one replica cannot serve, counts below the placement's work bound are removed by
    `theory`, tallied under pp=2; the bound is the one `work_bounds` gives from the placement's slowest
    stage, which is below the bound from the sum of its stages (one batch in flight)."""
    path = _scenario(tmp_path, DENSE)
    rate = 12.0
    _, (cands, _, _), removed = _grid(path, [4], L4_NODES, rate=rate, max_gpus=64)
    assert removed["theory"]["pp=2"] == removed["theory"]["configurations"] > 0
    sc = load_scenario(path)
    placed = Placement(4, 2, gpus_per_node=4)
    staged = plan_space.work_bounds(sc, "vllm", ("", "L4", 4, ()), rate, path.parent, placed)
    assert staged is not None
    assert min(c.counts[0] for c in cands) == staged[0] == removed["theory"]["configurations"] + 1
    # The same bound from the sum of the stages (a pipeline of one batch in flight) is higher.
    summed = lambda cost, p: lambda c, q: ParallelCost(cost, cost.model, cost.gpu, p).step_time(c, q)[0]  # noqa: E731
    monkeypatch.setattr(plan_space, "bottleneck_time", summed)
    whole = plan_space.work_bounds(sc, "vllm", ("", "L4", 4, ()), rate, path.parent, placed)
    assert whole is not None and whole[0] > staged[0]


def test_a_plan_over_placements_shows_them_in_its_row_plan_json_page_and_launch_line(tmp_path: Path) -> None:
    """A tiny search over TP 4 x PP 2 runs, and its row, plan.json and page show the placement."""
    path = _scenario(tmp_path, DENSE)
    out = tmp_path / "out"
    res = runner.invoke(
        app, ["plan", str(path), "--rate", "0.5", "--gpus", "L4", "--tp", "4", "--pp", "1,2", "--nodes", "2",
              "--gpus-per-node", "4", "--max-gpus", "16", "--jobs", "1", "--replications", "1",
              "--max-replications", "1", "--settle-seeds", "0", "--modes", "colocated", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads((out / "plan.json").read_text())
    assert info["placements"] == {"pp": [1, 2], "ep_dp": [], "nodes": 2, "gpus_per_node": 4}
    assert info["best"]["config"] == "1x L4 TP4 PP2 (2 nodes)"
    assert (info["best"]["pp"], info["best"]["ep"], info["best"]["dp"], info["best"]["nodes"]) == (2, 1, 1, 2)
    assert info["candidates"][0]["pp"] == 2
    (group,) = info["deploy"]["groups"]
    assert group["placement"] == "PP2 (2 nodes)" and "--pipeline-parallel-size 2" in group["command"]
    assert info["pruned_by_rule"]["does_not_fit"]["configurations"] == info["does_not_fit"] == 4
    page = (out / "index.html").read_text()
    assert "TP4 PP2 (2 nodes)" in page and "Placements: PP 1, 2" in page


def test_placement_options_are_checked_and_defaults_add_nothing(tmp_path: Path) -> None:
    assert placement_options("1", "", 1, 8) == PlacementAxes() and not PlacementAxes().searched
    with pytest.raises(SimError, match="--pp: expected whole numbers"):
        placement_options("two", "", 1, 8)
    with pytest.raises(SimError, match="--gpus-per-node: .*72"):
        placement_options("1", "", 1, 100)
    with pytest.raises(SimError, match="--ep-dp: .*dense"):
        _grid(_scenario(tmp_path, DENSE), [4], PlacementAxes((1,), (2,)))
    with pytest.raises(SimError, match="--pp: 200 stages exceed the 80 layers"):
        _grid(_scenario(tmp_path, DENSE), [4], PlacementAxes((200,)))
    with pytest.raises(SimError, match="--tp: 8 exceeds a node of 4 GPUs"):
        _grid(_scenario(tmp_path, DENSE), [4, 8], L4_NODES)

"""`sim plan --modes hetero`: prefill and decode groups each with their own GPU, TP and count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.studies import plan, plan_space

runner = CliRunner()
SCENARIO = """
name = "plan-hetero"
seed = 3
prices = { "A100-80GB" = 1.0, "H100-SXM" = 2.5 }
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "poisson", rate = 6.0 }
prompt = { kind = "lognormal", mean = 1500, cv = 0.3, min = 64, max = 3000 }
output = { kind = "lognormal", mean = 100, cv = 0.5, min = 4, max = 300 }
max_tokens = 300
[horizon]
duration_s = 30
[slo]
ttft_s = 1.0
tpot_s = 0.05
[policies.vllm]
scheduler = "vllm"
"""


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "hetero.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def test_hetero_grid_pairs_every_gpu_and_tp_per_role(scenario: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPU kinds at TP1 within 3 GPUs: A100 prefill + H100 decode and H100 prefill + A100 decode, each
    as 1P+1D, 1P+2D, 2P+1D: 6 configurations (the homogeneous splits are `pd`'s), priced per role."""
    sc = load_scenario(scenario)
    monkeypatch.setattr(plan_space, "work_bounds", lambda *a: (1, 1, 1))
    cands, total, unfit = plan_space.candidates(
        sc, "vllm", 6.0, scenario.parent, ["A100-80GB", "H100-SXM"], [1], {}, 3, ["hetero"]
    )
    assert (total, unfit, len(cands)) == (6, 0, 6)
    by_label = {c.label(): c for c in cands}
    c = by_label["2P x A100-80GB TP1 + 1D x H100-SXM TP1"]
    assert c.cost == pytest.approx(2 * 1.0 + 2.5) and c.gpus == 3
    groups = plan.configured(sc.raw, c.overrides(sc, "vllm"), str(scenario)).cluster.groups  # type: ignore[union-attr]
    assert [(g.role, g.count, g.gpu, g.tp) for g in groups] == [
        ("prefill", 2, "A100-80GB", 1), ("decode", 1, "H100-SXM", 1),
    ]  # fmt: skip
    # theory prunes each role by its own GPU's bound: a decode bound of 2 leaves only 1P+2D per pair
    monkeypatch.setattr(plan_space, "work_bounds", lambda *a: (1, 1, 2))
    cands, _, _ = plan_space.candidates(
        sc, "vllm", 6.0, scenario.parent, ["A100-80GB", "H100-SXM"], [1], {}, 3, ["hetero"]
    )
    assert sorted(c.counts for c in cands) == [(1, 2), (1, 2)]


def test_hetero_answer_reproduces_under_sim_run(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(
        app, ["plan", str(scenario), "--rate", "6", "--gpus", "A100-80GB,H100-SXM", "--max-gpus", "3",
              "--tp", "1", "--modes", "hetero", "--replications", "1", "--max-replications", "1",
              "--jobs", "1", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    best = json.loads((out / "plan.json").read_text())["best"]
    assert best is not None and best["gpu"] != best["decode_gpu"], res.output
    args = ["run", str(scenario), "--policy", "vllm"]
    for item in best["set"]:
        args += ["--set", item]
    run = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    summary = json.loads((tmp_path / "run" / "vllm" / "summary.json").read_text())
    groups = summary["cluster"]["groups"]
    assert {groups["prefill"]["gpu"], groups["decode"]["gpu"]} == {"A100-80GB", "H100-SXM"}
    assert summary["latency"]["tpot"]["p99"] == best["tpot_p99"]


def test_brute_force_grid_keeps_what_theory_prunes(scenario: Path) -> None:
    """`theory=False` (benchmarks/plan_brute_force.py's grid) keeps every configuration that fits; the
    planner's grid is the same size, with theory's prunings removed."""
    sc = load_scenario(scenario)
    args = (
        sc,
        "vllm",
        40.0,
        scenario.parent,
        ["A100-80GB", "H100-SXM"],
        [1],
        {},
        4,
        ["colocated", "pd", "hetero"],
    )
    pruned, total, unfit = plan_space.candidates(*args)
    every, total_all, unfit_all = plan_space.candidates(*args, theory=False)
    assert (total, unfit) == (total_all, unfit_all) and unfit == 0
    assert len(every) == total and len(pruned) < len(every)
    assert set(pruned) <= set(every)

"""`sim plan`: no costlier than brute force over the same grid; its answer reproduces under `sim run`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.cli import app
from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.studies import plan, plan_options, plan_result, plan_space

runner = CliRunner()
SCENARIO = """
name = "plan-small"
seed = 5
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "poisson", rate = 8.0 }
prompt = { kind = "lognormal", mean = 1000, cv = 0.5, min = 64, max = 3000 }
output = { kind = "lognormal", mean = 150, cv = 0.8, min = 4, max = 512 }
max_tokens = 512
[horizon]
duration_s = 30
[slo]
ttft_s = 0.5
tpot_s = 0.03
[policies.vllm]
scheduler = "vllm"
"""
RATE = 20.0
GPUS = ["A100-80GB", "H100-SXM"]
# $/GPU-hour given in the scenario, so the test does not hang on the catalogue's list prices
PRICES = {"A100-80GB": 1.0, "H100-SXM": 2.5}


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "plan.toml"
    prices = ", ".join(f'"{k}" = {v}' for k, v in PRICES.items())
    path.write_text(SCENARIO.replace("[model]", f"prices = {{ {prices} }}\n[model]", 1), encoding="utf-8")
    return path


def test_plan_is_no_costlier_than_brute_force(scenario: Path) -> None:
    """Brute force: run every configuration of the grid (1-3 replicas, TP1, both GPUs, colocated or any
    prefill/decode split) and take the cheapest that meets the SLO; the planner's answer must cost no more."""
    result = plan.search(scenario, [], RATE, GPUS, max_gpus=3, jobs=1, tps=[1])
    assert result.best is not None
    sc = load_scenario(scenario)
    raw = {**sc.raw, "workload": {**sc.raw["workload"], "arrival": {"kind": "poisson", "rate": RATE}}}
    shapes = [("colocated", (c,)) for c in (1, 2, 3)] + [("pd", pd) for pd in ((1, 1), (1, 2), (2, 1))]
    feasible = []
    for gpu in GPUS:
        for mode, counts in shapes:
            n = sum(counts)
            cand = plan_space.Candidate(n * PRICES[gpu], n, mode, get_gpu(gpu).name, 1, (), counts)
            task = plan.PlanTask(raw, str(scenario), str(scenario.parent), "vllm", cand.overrides(sc, "vllm"))
            if plan.meets(plan.evaluate(task), RATE, 0.9):
                feasible.append(cand.cost)
    assert result.grid_size == len(GPUS) * len(shapes)
    assert feasible, "the grid must hold an answer for the comparison to mean anything"
    assert result.best["cost_per_hour"] <= min(feasible) + 1e-9
    assert result.simulated < result.grid_size  # pruning ran fewer than brute force


def test_plan_answer_reproduces_under_sim_run(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(
        app, ["plan", str(scenario), "--rate", str(RATE), "--gpus", ",".join(GPUS), "--max-gpus", "3",
              "--tp", "1", "--jobs", "1", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "kernel tables of its own" not in res.output  # both GPUs have their own measured tables
    info = json.loads((out / "plan.json").read_text())
    best = info["best"]
    assert (out / "index.html").stat().st_size > 1000 and (out / "plan.parquet").is_file()
    assert f"workload.arrival.rate={RATE!r}" in best["set"]
    args = ["run", str(scenario), "--policy", "vllm"]
    for item in best["set"]:
        args += ["--set", item]
    run = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    summary = json.loads((tmp_path / "run" / "vllm" / "summary.json").read_text())
    assert summary["goodput_per_s"] == best["goodput_per_s"]
    assert summary["latency"]["ttft"]["p99"] == best["ttft_p99"]
    assert summary["latency"]["tpot"]["p99"] == best["tpot_p99"]


def test_plan_bad_input_is_one_line(scenario: Path) -> None:
    for args, key in (
        (["--gpus", "H1000"], "unknown GPU"),
        (["--gpus", "B200"], "no price for B200"),
        (["--tp", "x"], "--tp"),
        (["--modes", "both"], "--modes"),
    ):
        res = runner.invoke(app, ["plan", str(scenario), "--rate", "5", *args])
        assert res.exit_code == 2 and key in res.output and "Traceback" not in res.output, res.output


def test_scenario_prices_override_the_catalogue(scenario: Path) -> None:
    table = plan_space.price_table(load_scenario(scenario))
    assert table["H100-SXM"].usd_per_gpu_hour == 2.5
    assert table["L4"].usd_per_gpu_hour > 0 and table["L4"].source and table["L4"].date
    with pytest.raises(SimError):
        plan_space.price_table(load_scenario(scenario, ["prices={'H1000'=1.0}"]))


def test_p99_rule_checks_each_bound() -> None:
    class Slo:
        ttft_s, tpot_s, e2e_s = 2.0, 0.1, None

    # the judged requests' figures (`plan_verdict.judged_figures`): 10 judged, none good
    fig = {"overloaded": False, "finished": 10, "judged": 10, "judged_attainment": 0.0,
           "judged_ttft_p99": 1.9, "judged_tpot_p99": 0.09, "judged_e2e_p99": 3.0}  # fmt: skip
    assert plan.meets(fig, 5.0, 0.9, "p99", Slo())
    assert not plan.meets({**fig, "judged_tpot_p99": 0.11}, 5.0, 0.9, "p99", Slo())
    assert not plan.meets({**fig, "overloaded": True}, 5.0, 0.9, "p99", Slo())
    assert not plan.meets(fig, 5.0, 0.9, "goodput", Slo())  # no goodput: fails the goodput rule
    assert plan.meets({**fig, "judged_attainment": 0.9}, 5.0, 0.9, "goodput", Slo())  # goodput 4.5 of 5


def test_pareto_front_by_hand_and_chart_spec_valid() -> None:
    import polars as pl

    from sim.report.plan import front_chart

    rows = pl.DataFrame({
        "config": ["a", "b", "c", "d", "e"], "cost_per_hour": [1.0, 2.0, 2.0, 3.0, 4.0],
        "gpus": [1, 2, 2, 3, 4], "ttft_p99": [0.9, 0.5, 0.7, 0.6, 0.2], "tpot_p99": [0.01] * 5,
        "goodput_per_s": [1.0] * 5, "meets_slo": [True, True, True, True, False],
    })  # fmt: skip
    front = plan_result.pareto(rows)
    # d costs more than b and is slower; e misses the SLO: the front is a, b.
    assert front["config"].to_list() == ["a", "b"]
    front_chart(rows, front).to_dict(validate=True)


def _result_of(rule: str, extra: dict | None = None) -> tuple[plan_result.PlanResult, Any]:
    import polars as pl

    rows = pl.DataFrame({
        "config": ["a", "b", "c"], "cost_per_hour": [1.0, 2.0, 3.0], "gpus": [1, 2, 3],
        "ttft_p99": [0.9, 0.5, 0.2], "tpot_p99": [0.01] * 3, "goodput_per_s": [1.0] * 3,
        "meets_slo": [True, True, False], "mode": ["colocated"] * 3, "gpu": ["A100-80GB"] * 3, "tp": [1] * 3,
        "knobs": ["{}"] * 3, "counts": [[1], [2], [3]], **(extra or {}),
    })  # fmt: skip
    result = plan_result.PlanResult(
        20.0, 0.9, 3, 0, 0, rows=rows.to_dicts(), best=rows.row(0, named=True), rule=rule,
        slo={"ttft_s": 0.5, "tpot_s": 0.03, "e2e_s": None},
    )  # fmt: skip
    return result, rows


def _page_of(rule: str, front_rows: int, extra: dict | None = None) -> tuple[str, dict]:
    from sim.report.plan import front_chart, plan_page

    result, rows = _result_of(rule, extra)
    front = plan_result.pareto(rows).head(front_rows)
    return plan_page(result, rows, front, "plan.toml"), front_chart(rows, front).to_dict()


@pytest.mark.parametrize(
    ("rule", "stated"),
    [
        (
            "goodput",
            "goodput (requests per second meeting TTFT ≤ 0.5 s and TPOT ≤ 0.03 s) is at least 90% of",
        ),
        ("p99", "every p99 latency is within its bound: p99 TTFT ≤ 0.5 s, p99 TPOT ≤ 0.03 s"),
    ],
)
def test_plan_page_states_the_slo_and_the_rule_it_judged_by(rule: str, stated: str) -> None:
    html, _ = _page_of(rule, 2)
    assert stated in html and f"--rule {rule}" in html


@pytest.mark.parametrize("front_rows", [1, 2])
def test_plan_page_draws_the_front_its_caption_names(front_rows: int) -> None:
    """The front is drawn (ringed configurations, joined by a line when there are two or more) and the
    caption says how many configurations are on it."""
    html, spec = _page_of("goodput", front_rows)
    layers = spec["layer"]
    rings = [layer for layer in layers if layer["mark"].get("filled") is False]
    assert len(rings) == 1 and len(rings[0]["data"]["values"]) == front_rows
    assert any(layer["mark"]["type"] == "line" for layer in layers)
    named = "1 configuration" if front_rows == 1 else f"{front_rows} configurations"
    assert f"Pareto front ({named}" in html


def test_plan_page_and_table_say_how_many_requests_each_configurations_latencies_cover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration's p99 TTFT covers only its finished requests: the page and the terminal table say how
    many, beside it."""
    from sim.report.plan import print_plan

    counts = {"arrived": [100, 100, 1000], "finished": [100, 98, 400], "overrides": ["{}"] * 3}
    html, _ = _page_of("goodput", 2, counts)
    cells = ["100 of 100 (all finished)", "98 of 100 (2 unfinished)", "400 of 1,000 (600 unfinished)"]
    assert "<th>latencies over</th>" in html and all(f"<td>{c}</td>" in html for c in cells)
    monkeypatch.setenv("COLUMNS", "200")
    print_plan(_result_of("goodput", counts)[0], tmp_path)
    out = capsys.readouterr().out
    assert "latencies over" in out and all(c in out for c in cells), out


def test_plan_refuses_an_empty_gpu_list_and_names_a_tp_that_does_not_divide_the_heads(scenario: Path) -> None:
    """`--gpus ""` used to fall back to model.gpu, and `--tp 3` was counted as not fitting in memory."""
    for gpus in ("", " , "):
        with pytest.raises(SimError, match="--gpus: give one or more GPU types"):
            plan_options.grid_options(gpus, "1", "", "", "colocated")
    res = runner.invoke(app, ["plan", str(scenario), "--rate", "5", "--tp", "1,3"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "--tp: tensor parallel degree 3 must divide the 32 attention heads" in res.output
    assert "memory" not in res.output


def test_plan_on_a_dask_cluster_gives_the_plan_of_one_process(scenario: Path, tmp_path: Path) -> None:
    """`sim plan --executor dask --address ...` on a 2-worker LocalCluster: the same answer and the same
    figures for every configuration both ran as `--jobs 1` in-process."""
    distributed = pytest.importorskip("dask.distributed")  # in the dev extra; skipped only without it
    args = ["plan", str(scenario), "--rate", str(RATE), "--gpus", ",".join(GPUS), "--max-gpus", "3"]
    args += ["--tp", "1"]
    local = runner.invoke(app, [*args, "--jobs", "1", "--out", str(tmp_path / "local")])
    assert local.exit_code == 0, local.output
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, protocol="tcp://", dashboard_address=None
    ) as cluster:
        remote = runner.invoke(
            app, [*args, "--jobs", "2", "--executor", "dask", "--address", cluster.scheduler_address,
                  "--out", str(tmp_path / "dask")],
        )  # fmt: skip
    assert remote.exit_code == 0, remote.output
    one, two = (json.loads((tmp_path / d / "plan.json").read_text()) for d in ("local", "dask"))
    assert one["best"] is not None and two["best"] == one["best"]
    assert two["single_replica_capacity_req_per_s"] == one["single_replica_capacity_req_per_s"]
    rows_one, rows_two = (pl.read_parquet(tmp_path / d / "plan.parquet") for d in ("local", "dask"))
    both = rows_one.join(rows_two.select("config"), on="config").sort("config")
    assert both.height > 1 and both.equals(rows_two.join(both.select("config"), on="config").sort("config"))


def test_plan_address_needs_the_dask_executor(scenario: Path) -> None:
    res = runner.invoke(app, ["plan", str(scenario), "--rate", "5", "--address", "tcp://127.0.0.1:1"])
    assert res.exit_code == 2 and "goes with --executor dask" in res.output, res.output
    assert "Traceback" not in res.output


def test_a_plan_says_which_gpus_rest_on_the_transfer_rule() -> None:
    """A configuration on a GPU without kernel tables is costed by another GPU's measured ratios: the plan
    says whose, once per such GPU; a GPU with its own tables gets no line."""
    from types import SimpleNamespace

    from sim.report.plan import transfer_lines

    rows = [{"gpu": "L4"}, {"gpu": "A100-80GB"}, {"gpu": "L4"}, {"gpu": "T4"}]
    lines = transfer_lines(SimpleNamespace(rows=rows))  # type: ignore[arg-type]
    assert len(lines) == 2 and lines[0].startswith("L4 has no kernel tables") and "L40S" in lines[0]
    assert lines[1].startswith("T4 has no kernel tables") and "every profiled GPU, pooled" in lines[1]

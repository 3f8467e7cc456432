"""`sim plan`'s opt-in axes: weight and KV formats and chunked prefill, pruned by proofs only, with what
each pruning rule removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.studies import plan, plan_options, plan_space

runner = CliRunner()
SCENARIO = """
name = "plan-axes"
seed = 2
prices = { "A100-80GB" = 1.0, "T4" = 0.3 }
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "poisson", rate = 4.0 }
prompt = { kind = "lognormal", mean = 600, cv = 0.5, min = 64, max = 1500 }
output = { kind = "lognormal", mean = 80, cv = 0.8, min = 4, max = 200 }
max_tokens = 200
[horizon]
duration_s = 20
[slo]
ttft_s = 1.0
tpot_s = 0.05
[policies.vllm]
scheduler = "vllm"
"""


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "axes.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def test_formats_and_chunked_prefill_widen_the_grid_into_runnable_configurations(scenario: Path) -> None:
    sc = load_scenario(scenario)
    _, _, base, _ = plan_options.grid_options("A100-80GB", "1", "", "", "colocated")
    gpus, tps, knobs, modes = plan_options.grid_options(
        "A100-80GB", "1", "", "", "colocated", "bf16,fp8", "fp8", "on,off"
    )
    one = plan_space.candidates(sc, "vllm", 4.0, scenario.parent, gpus or [], tps, base, 2, modes, False)
    wide = plan_space.candidates(sc, "vllm", 4.0, scenario.parent, gpus or [], tps, knobs, 2, modes, False)
    assert wide[1] == 4 * one[1]  # 2 weight formats x 1 KV format x chunked on and off
    seen = set()
    for c in wide[0]:
        overrides = c.overrides(sc, "vllm")
        seen.add((overrides["model.weight_dtype"], overrides["policies.vllm.enable_chunked_prefill"]))
        assert overrides["model.kv_dtype"] == "fp8"
        configured = plan.configured(sc.raw, overrides, str(scenario))
        assert configured.model.weight_dtype == overrides["model.weight_dtype"]
        assert (
            configured.policy("vllm")[1].enable_chunked_prefill
            is overrides["policies.vllm.enable_chunked_prefill"]
        )
    assert seen == {("bf16", True), ("bf16", False), ("fp8", True), ("fp8", False)}


def test_each_pruning_rule_says_what_it_removed_by_format(scenario: Path) -> None:
    """On a T4 (15 GB, no bf16) the 8B model's bf16 weights cannot run, its fp16 weights do not fit, and
    its int4 weights fit: three rules, each counted under the format it removed."""
    sc = load_scenario(scenario)
    gpus, tps, knobs, modes = plan_options.grid_options("T4", "1", "", "", "colocated", "bf16,fp16,int4")
    removed: dict[str, dict[str, int]] = {}
    cands, total, unfit = plan_space.candidates(
        sc, "vllm", 4.0, scenario.parent, gpus or [], tps, knobs, 3, modes, removed=removed
    )
    assert total == 9
    assert removed["format_unsupported"] == {
        "configurations": 3,
        "gpu=T4": 3,
        "tp=1": 3,
        "weight_dtype=bf16": 3,
    }
    assert removed["does_not_fit"]["weight_dtype=fp16"] == 3 and unfit == 3
    assert cands and {dict(c.knobs)["weight_dtype"] for c in cands} == {"int4"}
    theory = removed.get("theory", {}).get("configurations", 0)
    assert len(cands) + theory == 3
    assert removed.get("theory", {}).get("weight_dtype=int4", 0) == theory


def test_plan_searches_chunked_prefill_and_reports_what_each_rule_removed(
    scenario: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(
        app, ["plan", str(scenario), "--rate", "4", "--gpus", "A100-80GB,T4", "--max-gpus", "2", "--tp", "1",
              "--jobs", "1", "--replications", "2", "--chunked-prefill", "on,off", "--weight-dtypes", "bf16",
              "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads((out / "plan.json").read_text())
    # T4: bf16 weights, 3 shapes (1 or 2 colocated, 1P+1D) x chunked on and off
    assert info["format_unsupported"] == 6
    assert info["pruned_by_rule"]["format_unsupported"]["enable_chunked_prefill=False"] == 3
    assert "Removed by format_unsupported: 6" in res.output
    assert "Removed by format_unsupported: 6 (" in (out / "index.html").read_text()
    labels = [c["config"] for c in info["candidates"]]
    for on in ("True", "False"):  # configurations of equal cost are all judged
        assert any(f"enable_chunked_prefill={on}" in label for label in labels), labels
    assert json.loads(info["best"]["knobs"])["weight_dtype"] == "bf16"


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--weight-dtypes", "fp7", "--weight-dtypes: 'fp7': expected one of"),
        ("--kv-dtypes", "int4", "--kv-dtypes: 'int4': expected one of"),
        ("--chunked-prefill", "maybe", "--chunked-prefill: expected on, off or both"),
    ],
)
def test_bad_axis_values_are_one_error_line(scenario: Path, option: str, value: str, says: str) -> None:
    res = runner.invoke(app, ["plan", str(scenario), "--rate", "4", option, value])
    assert res.exit_code == 2
    assert says in res.output and "Traceback" not in res.output

"""`sim plan --rate-steps`: the highest rate a configuration sustains, against a D/D/1 queue's capacity."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.studies.run import run_policy

runner = CliRunner()
SCENARIO = """
name = "plan-dd1"
seed = 3
prices = { "A100-80GB" = 2.0 }
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "deterministic", rate = 1.0 }
prompt = { kind = "fixed", value = 500 }
output = { kind = "fixed", value = 50 }
max_tokens = 50
[horizon]
duration_s = 20
[slo]
ttft_s = 1.5
[policies.vllm]
scheduler = "vllm"
max_num_seqs = 1
"""


def test_bisection_finds_a_dd1_queues_capacity(tmp_path: Path) -> None:
    """One replica serving one request at a time, evenly spaced arrivals of equal requests: a D/D/1 queue,
    whose service time S is a lone request's time in the system. Below 1/S nothing waits; above it the
    backlog grows with the run. Six verdicts bisect from 1 req/s up to the capacity bound (one replica's
    saturated throughput / 0.9): the rate sustained and the lowest rate not met bracket 1/S (within 1%),
    the bracket is 1/2^6 of the start, and the tokens/s per GPU and requests/s per $/hour follow from
    the rate (50 output tokens a request, $2/hour)."""
    path = tmp_path / "dd1.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    lone = load_scenario(path, ["horizon.max_requests=1", "horizon.drain=true"])
    service = float(run_policy(lone, "vllm", tmp_path, source=str(path)).requests["e2e"][0])
    capacity = 1.0 / service
    out = tmp_path / "plan"
    args = ["plan", str(path), "--rate", "1", "--max-gpus", "1", "--tp", "1", "--modes", "colocated",
            "--jobs", "1", "--max-horizon", "120", "--out", str(out)]  # fmt: skip
    res = runner.invoke(app, [*args, "--rate-steps", "6"])
    assert res.exit_code == 0, res.output
    info = json.loads((out / "plan.json").read_text())
    (s,) = info["sustained_rates"]["configurations"]
    low, high, upper = s["sustained_rate_per_s"], s["not_met_rate_per_s"], s["upper_bound_per_s"]
    assert s["steps"] == 6 and len(s["probes"]) == 6
    assert low <= capacity * 1.01 and high >= capacity * 0.99, (low, high, capacity)
    assert high - low <= (upper - 1.0) / 2**6 * 1.0001
    assert abs(s["output_tokens_per_s_per_gpu"] / (low * 50) - 1) < 0.03
    assert s["requests_per_s_per_dollar_hour"] == low / 2.0
    assert "1x A100-80GB TP1 sustains" in res.output
    assert "1x A100-80GB TP1 sustains" in (out / "index.html").read_text()
    off = runner.invoke(app, [*args[:-1], str(tmp_path / "off")])
    assert off.exit_code == 0, off.output
    assert "sustained_rates" not in json.loads((tmp_path / "off" / "plan.json").read_text())

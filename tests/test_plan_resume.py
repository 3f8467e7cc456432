"""`sim plan` resumes: a plan interrupted part-way, run again, writes the same plan.json byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.studies import plan, plan_runs

runner = CliRunner()
SCENARIO = """
name = "plan-resume"
seed = 3
prices = { "A100-80GB" = 1.0, "H100-SXM" = 2.5 }
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "poisson", rate = 8.0 }
prompt = { kind = "lognormal", mean = 800, cv = 0.5, min = 64, max = 2000 }
output = { kind = "lognormal", mean = 100, cv = 0.8, min = 4, max = 256 }
max_tokens = 256
[horizon]
duration_s = 20
[slo]
ttft_s = 0.5
tpot_s = 0.03
[policies.vllm]
scheduler = "vllm"
"""


class Interrupted(Exception):
    pass


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "resume.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _plan(scenario: Path, out: Path, *extra: str) -> Any:
    args = ["plan", str(scenario), "--rate", "14", "--gpus", "A100-80GB,H100-SXM", "--max-gpus", "2",
            "--tp", "1", "--jobs", "1", "--explore", "1", "--out", str(out), *extra]  # fmt: skip
    return runner.invoke(app, args)


def test_an_interrupted_plan_rerun_writes_the_same_plan_byte_for_byte(
    scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _plan(scenario, tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    expected = (tmp_path / "whole" / "plan.json").read_bytes()
    total = len(list((tmp_path / "whole" / "runs").glob("*.json")))

    real, calls = plan.evaluate, []

    def fails_after_four(task: plan.PlanTask) -> dict[str, Any]:
        if len(calls) == 4:
            raise Interrupted
        calls.append(task)
        return real(task)

    out = tmp_path / "resumed"
    with monkeypatch.context() as patch:
        patch.setattr(plan, "evaluate", fails_after_four)
        cut = _plan(scenario, out)
    assert isinstance(cut.exception, Interrupted)
    assert not (out / "plan.json").exists()
    kept = sorted((out / "runs").glob("*.json"))
    assert 4 < len(kept) < total  # the capacity runs and four replications were kept, not the rest
    kept[-1].write_text('{"key": "torn', encoding="utf-8")  # a damaged file is run again

    again = _plan(scenario, out)
    assert again.exit_code == 0, again.output
    assert (out / "plan.json").read_bytes() == expected
    assert f"{len(kept) - 1} read back" in again.output
    assert f"{total - len(kept) + 1} runs run" in again.output


def test_force_runs_every_run_again(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    assert _plan(scenario, out).exit_code == 0
    first = (out / "plan.json").read_bytes()
    again = _plan(scenario, out)
    assert "0 runs run" in again.output
    forced = _plan(scenario, out, "--force")
    assert "0 read back" in forced.output
    assert (out / "plan.json").read_bytes() == first


def test_a_run_key_changes_with_what_the_run_depends_on() -> None:
    task = plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 2})
    same = plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 2})
    assert plan_runs.run_key("run", task) == plan_runs.run_key("run", same)
    for other in (
        plan.PlanTask({"seed": 2}, "a.toml", ".", "vllm", {"cluster.replicas": 2}),
        plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 3}),
        plan.PlanTask({"seed": 1}, "a.toml", ".", "sarathi", {"cluster.replicas": 2}),
    ):
        assert plan_runs.run_key("run", other) != plan_runs.run_key("run", task)
    assert plan_runs.run_key("capacity", task) != plan_runs.run_key("run", task)
    # 1 and 1.0 validate alike, so they key alike; 1.5 does not.
    whole = plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 2.0, "x": [1.0]})
    assert plan_runs.run_key("run", whole) == plan_runs.run_key(
        "run", plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 2, "x": [1]})
    )
    half = plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {"cluster.replicas": 2.5})
    assert plan_runs.run_key("run", half) != plan_runs.run_key("run", task)


def test_a_run_made_by_another_simulator_is_not_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's kept runs are keyed by the simulator's code and data too: after an upgrade or a new
    calibration, a run is made again rather than read back with the old figures."""
    task = plan.PlanTask({"seed": 1}, "a.toml", ".", "vllm", {})
    before = plan_runs.run_key("run", task)
    monkeypatch.setattr(plan_runs, "simulator_fingerprint", lambda: "another simulator")
    assert plan_runs.run_key("run", task) != before

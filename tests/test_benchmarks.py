"""The benchmark instruments: the floor loop serves every request, the fleet scenario is valid, the checks
read the targets right. Nothing here is timed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.scenario import read_toml, validate_scenario

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


floor = _load("floor")
fleet = _load("bench_fleet")


def test_floor_serves_every_request_of_a_sharegpt_like_stream() -> None:
    arrivals, outputs = floor.stream(300, 0.7, seed=3)
    result = floor.run_floor(arrivals, outputs)
    assert (result.requests, result.finished) == (300, 300)
    # Every step yields one token per running request, at most max_batch of them.
    assert result.steps >= outputs.sum() / floor.MAX_BATCH
    assert result.simulated_s >= arrivals[-1]


def test_floor_steps_and_clock_by_hand() -> None:
    # Batch of 2: step 0 admits the first two (prefill); the 1-token request leaves after it, so step 1
    # admits the third (prefill); then two decode steps finish the 3-token request.
    result = floor.run_floor(np.zeros(3), np.array([1, 2, 3]), max_batch=2, prefill_s=0.5, decode_s=0.25)
    assert (result.finished, result.steps) == (3, 4)
    assert result.simulated_s == pytest.approx(0.5 + 0.5 + 0.25 + 0.25)


def test_floor_sleeps_until_the_next_arrival_when_idle() -> None:
    result = floor.run_floor(np.array([0.0, 10.0]), np.array([1, 1]), prefill_s=0.5, decode_s=0.25)
    assert (result.finished, result.steps) == (2, 2)
    assert result.simulated_s == pytest.approx(10.5)


@settings(max_examples=30, deadline=None)
@given(
    outputs=st.lists(st.integers(1, 40), min_size=1, max_size=40),
    max_batch=st.integers(1, 8),
)
def test_floor_with_everything_at_once_takes_the_token_count_of_a_packed_batch(
    outputs: list[int], max_batch: int
) -> None:
    # All requests queued at t = 0, admitted first come first served: each step serves min(batch, left)
    # requests, one token each, so the number of steps is at least ceil(total tokens / max_batch) and at
    # most the tokens of a one-at-a-time replica.
    result = floor.run_floor(np.zeros(len(outputs)), np.array(outputs), max_batch=max_batch)
    assert result.finished == len(outputs)
    assert -(-sum(outputs) // max_batch) <= result.steps <= sum(outputs)
    if max_batch >= len(outputs):
        assert result.steps == max(outputs)


@pytest.mark.parametrize("policy", list(fleet.POLICIES))
def test_fleet_scenario_is_a_valid_scenario(tmp_path: Path, policy: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(fleet.scenario_toml(policy, 1234, '{ kind = "poisson", rate = 2.5 }', seed=4))
    sc = validate_scenario(read_toml(path), str(path))
    assert list(sc.policies) == [policy] and sc.policy(policy)[0] == policy
    assert sc.horizon.max_requests == 1234 and sc.horizon.drain
    assert sc.workload.max_tokens == 2048


def _row(what: str, n: int, wall: float, rss_mib: float) -> Any:
    return fleet.Row(what, n, n, wall, wall, rss_mib)


def test_checks_read_the_targets() -> None:
    floors = {n: _row("floor", n, 1.0, 50) for n in (20_000, 100_000, 1_000_000)}
    rows = [
        _row("vllm", 100_000, 0.5, 300),  # twice the floor's requests per second
        _row("vllm", 20_000, 0.1, 300),
        _row("vllm", 1_000_000, 9.0, 500),  # +200 MiB = 209.7 MB: over 200 MB
        _row("continuous", 20_000, 0.1, 300),
        _row("continuous", 1_000_000, 9.0, 390),  # +90 MiB = 94.4 MB
    ]
    lines = fleet.checks(rows, floors, ["vllm", "continuous"])
    assert lines[0].startswith("speed: vllm at 100,000 requests runs 2.00 x the floor")
    assert lines[0].endswith(": met")
    assert "+210 MB" in lines[1] and lines[1].endswith("not met")
    assert "+94 MB" in lines[2] and lines[2].endswith(": met")


def test_checks_extrapolate_when_the_largest_size_is_smaller() -> None:
    floors = {n: _row("floor", n, 1.0, 50) for n in (20_000, 200_000)}
    rows = [_row("vllm", 20_000, 1.0, 100), _row("vllm", 200_000, 1.0, 100 + 180 / 1.048576)]
    (line,) = fleet.checks(rows, floors, ["vllm"])
    # 180 MB over 180,000 requests is 1 kB per request: 980 MB from 20,000 to 1,000,000.
    assert "+180 MB" in line and "linear extrapolation 20,000 -> 1,000,000: +980 MB" in line


def test_same_steps_floor_replays_a_runs_steps_and_arrivals(tmp_path: Path) -> None:
    """The same-steps floor takes the run's own steps, idle gaps included, and wakes once per arrival: its
    clock ends where the run's last step ended, after every step and arrival."""
    from typer.testing import CliRunner

    from sim.cli import app

    same = _load("same_steps_floor")
    scenario = tmp_path / "s.toml"
    scenario.write_text(fleet.scenario_toml("vllm", 50, '{ kind = "poisson", rate = 0.1 }', 3))
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    inputs = tmp_path / "same.npz"
    fleet.write_same_steps_inputs(tmp_path / "out" / "vllm", inputs)
    with np.load(inputs) as data:
        start, duration, arrival = data["start"], data["duration"], data["arrival"]
    assert (start[1:] > start[:-1] + duration[:-1]).any()  # the run idled between some steps
    result = same.replay(start, duration, arrival)
    assert (result.steps, result.arrivals) == (len(start), 50)
    assert result.simulated_s == pytest.approx(start[-1] + duration[-1], rel=1e-12)


def test_checks_and_table_give_the_ratio_to_the_same_steps_floor() -> None:
    floors = {100_000: _row("floor", 100_000, 2.0, 50)}
    loops = {100_000: _row("floor (loop only)", 100_000, 1.0, 50)}
    run = fleet.Row("vllm", 100_000, 100_000, 4.0, 4.0, 150.0, steps=480_000)
    own = _row("same steps (vllm)", 100_000, 1.0, 60)
    rows = [run, own, _row("same steps (vllm, loop only)", 100_000, 0.5, 60)]
    lines = fleet.checks(rows, floors, ["vllm"])
    assert any(line.startswith("same steps: vllm at 100,000 requests runs 0.25 x its own 480,000 steps")
               for line in lines)  # fmt: skip
    vllm_line = next(
        line for line in fleet.table(rows, floors, loops).splitlines() if line.startswith("vllm ")
    )
    assert vllm_line.split()[-2] == "0.25"  # x same: a quarter of its same-steps floor's requests per second


def test_speculation_verdict_keeps_its_defaults_and_takes_an_eagle3_head() -> None:
    """The default target (Llama-3.1-70B on 4 x H100, the Qwama draft, k = 4, alpha = 0.5) as before, and
    EAGLE-3 on Llama-3.1-8B (docs/speculative.md): its reduced LM head pays, and a tree's acceptance length
    given to a chain lifts the speed-up well past the chain's."""
    module = _load("speculation_verdict")
    verdict, greedy = module.verdict, module.SETTINGS["greedy"]
    assert verdict(1, 500, None) == verdict(1, 500, None, "draft", 0.5, 4, ("llama-3.1-70b", "H100-SXM", 4))
    target = ("llama-3.1-8b-instruct", "H100-SXM", 1)
    eagle3 = verdict(1, 500, greedy, "eagle", 0.755, 4, target, (1, 32000))
    full_head = verdict(1, 500, greedy, "eagle", 0.755, 4, target, (1, None))
    tree_length = verdict(1, 500, greedy, "eagle", 0.922, 7, target, (1, 32000))
    assert 1.0 < full_head < eagle3 < (1 - 0.755**5) / (1 - 0.755)  # below its tokens per step
    assert tree_length > 1.5 * eagle3


def test_deepseek_published_sets_each_figure_against_its_stated_setup() -> None:
    """benchmarks/deepseek_published.py (docs/parallelism.md): DeepSeek's rows on the H800, SGLang's on the
    H100, each placement one the checks accept, each ratio the simulator's figure over the source's."""
    ds = _load("deepseek_published")
    gpus = {s.name.split()[0]: s.gpu for s in ds.SETUPS}
    assert gpus == {"SGLang": "H100-SXM", "DeepSeek": "H800-SXM"}
    rows = ds.rows()
    assert [r["source"] for r in rows[:6]] == [52_300, 22_300, 73_700, 14_800, 62_713, 18_598]  # + profile
    for r in rows[:6]:
        assert r["ratio"] == pytest.approx(r["sim"] / r["source"], abs=1e-3)
        assert r["ratio_tbo"] == pytest.approx(r["sim_tbo"] / r["source"], abs=1e-3)
    assert round(ds.DS_PROMPT * ds.HIT) == ds.DS_PROMPT - ds.DS_NEW  # the cached share of each prompt


def test_deepseek_published_runs_the_sources_ep_degrees_with_deepep_and_eplb() -> None:
    """The sources' placements as stated: EP32 prefill, EP72 and EP144 decode, expressible with 32 redundant
    experts; DeepEP's kernels and FP8 dispatch. `--old` keeps the rows of the per-expert rule."""
    ds = _load("deepseek_published")
    assert [s.placement.ep for s in ds.SETUPS] == [32, 72, 32, 144, 32, 128]
    for s in ds.SETUPS:
        p = s.placement
        assert (p.ep_all_to_all, p.ep_dispatch_dtype) == ("deepep_auto", "fp8")
    # 32 redundant experts (SGLang's, DeepSeek's production); DeepSeek's EP128 decode profile has none
    assert [s.placement.ep_redundant_experts for s in ds.SETUPS] == [32, 32, 32, 32, 32, 0]
    assert [s.placement.ep for s in ds.OLD_SETUPS] == [32, 64, 32, 128, 32, 128]
    new, old = ds.rows(), ds.rows(ds.OLD_SETUPS)
    assert new[0]["dispatch_ms_per_layer"] < old[0]["dispatch_ms_per_layer"] / 4  # per node, FP8
    assert old[0]["dispatch_ms_per_layer"] == old[0]["combine_ms_per_layer"]  # the old rule: both BF16
    assert new[0]["dispatch_ms_per_layer"] < new[0]["combine_ms_per_layer"]  # FP8 dispatch, BF16 combine
    ll = ds.deepep_rows()
    assert [r["ep"] for r in ll] == [16, 32, 64, 128, 256]
    assert all(0.7 < r["dispatch_ratio"] < 1.1 and 0.7 < r["combine_ratio"] < 1.1 for r in ll)


def test_plan_brute_force_runs_as_documented() -> None:
    """The script's command line reaches its answer (its grid options come from sim.studies.plan_options)."""
    args = ["scenarios/convoy.toml", "--rate", "1", "--gpus", "H100-SXM", "--tp", "1", "--max-gpus", "1",
            "--seeds", "1", "--duration", "5", "--modes", "colocated", "--rule", "p99",
            "--skip-plan"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH / "plan_brute_force.py"), *args], capture_output=True, text=True,
        cwd=BENCH.parent, env={**os.environ, "PYTHONPATH": str(BENCH.parent)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["brute_force"]["config"] == "1x H100-SXM TP1"

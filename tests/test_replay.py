"""Step-level replay reproduces vLLM v1's scheduling decisions on the conformance cases.

Every `NAME.trace.json` under tests/data/oracle/ has a `NAME.steps.jsonl.gz` logged by the real scheduler
(vllm 0.32.0); see the README there. `RULES` checks, on the vLLM logs alone, that each case exercises the rule
it was made for.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from sim.cli import runs as cli_runs
from sim.io.errors import SimError
from sim.studies.replay import compare, config_from, load_trace, read_steps, replay, run

DATA = Path(__file__).parent / "data" / "oracle"
CASES = sorted(p.name.removesuffix(".trace.json") for p in DATA.glob("*.trace.json"))
Steps = list[dict[str, Any]]
Config = dict[str, Any]


def test_every_case_has_its_log() -> None:
    assert len(CASES) >= 16
    assert all((DATA / f"{case}.steps.jsonl.gz").exists() for case in CASES)


def test_traces_are_those_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_traces", DATA / "driver" / "make_traces.py")
    assert spec is not None and spec.loader is not None
    make_traces = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_traces)
    for name, make in make_traces.TRACES.items():
        assert json.loads((DATA / f"{name}.trace.json").read_text()) == make(), name


@pytest.mark.parametrize("case", CASES)
def test_oracle_case_reproduced_step_for_step(case: str) -> None:
    config, expected = read_steps(DATA / f"{case}.steps.jsonl.gz")
    actual = replay(load_trace(DATA / f"{case}.trace.json"), config_from(config))
    result = compare(expected, actual)
    assert result.first_diff is None, "\n".join(result.report())
    assert result.share == 1.0


def _trace(case: str) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in json.loads((DATA / f"{case}.trace.json").read_text())}


def _threshold_off_for_a_lone_request(config: Config, steps: Steps, case: str) -> bool:
    first = steps[0]
    return (
        first["arrived"] == ["r0"]
        and first["scheduled"] == [["r0", 864]]
        and (0 < config["long_prefill_token_threshold"] < 864 <= config["max_num_batched_tokens"])
    )


def _threshold_on_and_off_for_running(config: Config, steps: Steps, case: str) -> bool:
    """A running request's chunk is cut to the threshold beside others, and not when it runs alone."""
    threshold = config["long_prefill_token_threshold"]
    cut = alone = False
    for s in steps:
        admitted = set(s["new"]) | set(s["resumed"])
        for rid, n in s["scheduled"]:
            if rid in admitted:
                continue
            cut |= n == threshold and s["num_running"] + s["num_waiting"] > 1
            alone |= n > threshold and len(s["scheduled"]) == 1 and s["num_waiting"] == 0
    return cut and alone


def _admitted_alone_past_the_watermark(config: Config, steps: Steps, case: str) -> bool:
    """Blocks for the whole prompt plus the watermark exceed the free blocks, yet it is admitted (alone)."""
    first = steps[0]
    if first["arrived"] != ["r0"] or first["new"] != ["r0"]:
        return False
    blocks = -(-_trace(case)["r0"]["prompt_len"] // config["block_size"])
    return (
        config["watermark_blocks"] > 0
        and blocks + config["watermark_blocks"] > config["free_blocks_at_start"]
    )


def _preemptions_in_one_step(least: int) -> Callable[[Config, Steps, str], bool]:
    return lambda config, steps, case: any(len(s["preempted"]) >= least for s in steps)


def _outputs_capped_by_max_model_len(config: Config, steps: Steps, case: str) -> bool:
    trace = _trace(case)
    capped = [t for t in trace.values() if t["prompt_len"] + t["max_tokens"] > config["max_model_len"]]
    return len(capped) >= 5 and any(s["preempted"] for s in steps)


def _children_of_parallel_sampling(config: Config, steps: Steps, case: str) -> bool:
    """Requests with n > 1 arrive as child sequences `{k}_{id}`, some of them preempted."""
    arrived = [rid for s in steps for rid in s["arrived"]]
    preempted = [rid for s in steps for rid in s["preempted"]]
    return any(rid.startswith("3_") for rid in arrived) and any("_" in rid for rid in preempted)


def _siblings_share_the_prompt(config: Config, steps: Steps, case: str) -> bool:
    """A child's first chunk is shorter than its prompt: it found its sibling's blocks in the cache."""
    trace = _trace(case)
    return config["enable_prefix_caching"] and any(
        n < trace[rid.split("_", 1)[1]]["prompt_len"] and rid.startswith("1_")
        for s in steps
        for rid, n in s["scheduled"]
        if rid in s["new"] and "_" in rid
    )


def _block_size(size: int, preempting: bool) -> Callable[[Config, Steps, str], bool]:
    return lambda config, steps, case: (
        config["block_size"] == size and (not preempting or any(s["preempted"] for s in steps))
    )


def _bursts(config: Config, steps: Steps, case: str) -> bool:
    return sum(1 for s in steps if len(s["arrived"]) >= 6) >= 3


def _max_num_seqs_binds(config: Config, steps: Steps, case: str) -> bool:
    """Requests wait with budget and blocks to spare, only because max_num_seqs are running."""
    return any(
        s["num_running"] == config["max_num_seqs"]
        and s["num_waiting"] > 0
        and s["total_tokens"] < config["max_num_batched_tokens"]
        and s["free_blocks_after_schedule"] > 100
        for s in steps
    )


def _prefix_caching_with_preemption(config: Config, steps: Steps, case: str) -> bool:
    groups = {t.get("prefix_group") for t in _trace(case).values() if t.get("prefix_len", 0) >= 64}
    return config["enable_prefix_caching"] and len(groups) >= 2 and sum(len(s["resumed"]) for s in steps) >= 5


RULES: dict[str, Callable[[Config, Steps, str], bool]] = {
    "long-prefill": _threshold_off_for_a_lone_request,
    "long-prefill-running": _threshold_on_and_off_for_running,
    "watermark": _admitted_alone_past_the_watermark,
    "multi-preempt": _preemptions_in_one_step(2),
    "preempt-chain": _preemptions_in_one_step(3),
    "max-model-len": _outputs_capped_by_max_model_len,
    "n-parallel": _children_of_parallel_sampling,
    "n-parallel-prefix": _siblings_share_the_prompt,
    "block-32": _block_size(32, preempting=True),
    "block-8": _block_size(8, preempting=True),
    "burst": _bursts,
    "max-seqs": _max_num_seqs_binds,
    "prefix-preempt": _prefix_caching_with_preemption,
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_case_exercises_its_rule(case: str) -> None:
    config, steps = read_steps(DATA / f"{case}.steps.jsonl.gz")
    assert RULES[case](config, steps, case)


# Replaying a case with its rule's setting changed must no longer match vLLM's log.
WITHOUT_RULE = {
    "long-prefill": {"long_prefill_token_threshold": 0},
    "long-prefill-running": {"long_prefill_token_threshold": 0},
    "watermark": {"watermark_blocks": 0},
    "max-model-len": {"max_model_len": 4096},
    "max-seqs": {"max_num_seqs": 5},
    "prefix-preempt": {"enable_prefix_caching": False},
    "n-parallel-prefix": {"enable_prefix_caching": False},
}


@pytest.mark.parametrize("case", sorted(WITHOUT_RULE))
def test_case_depends_on_its_setting(case: str) -> None:
    config, expected = read_steps(DATA / f"{case}.steps.jsonl.gz")
    actual = replay(load_trace(DATA / f"{case}.trace.json"), config_from({**config, **WITHOUT_RULE[case]}))
    assert compare(expected, actual).first_diff is not None


def _app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, whatever other commands exist
    app.command("replay-steps")(cli_runs.replay_steps)
    return app


def test_cli_compare_and_write(tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    args = ["replay-steps", str(DATA / "prefix.trace.json"), "--compare", str(DATA / "prefix.steps.jsonl.gz")]
    res = CliRunner().invoke(_app(), [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "(100.00%)" in res.output
    config, steps = read_steps(out)
    assert config["enable_prefix_caching"] is True and len(steps) == 890


def test_report_names_the_differing_keys_and_a_missing_step() -> None:
    step = {"step": 0, "scheduled": [["r0", 5]], "total_tokens": 5}
    other = {**step, "scheduled": [["r0", 4]], "total_tokens": 4}
    lines = compare([step, step], [other]).report()
    assert lines[0] == "identical steps: 0/2 (0.00%)"
    assert lines[1] == "first difference at step 0, in: scheduled, total_tokens"
    assert lines[2] == "  expected: " + json.dumps(step) and lines[3] == "  actual:   " + json.dumps(other)
    lines = compare([step, {**step, "step": 1}], [step]).report()
    assert lines[1].startswith("first difference at step 1, in: step, arrived")
    assert lines[3] == "  actual:   (no step 1: this log ends before it)"


def test_cli_compare_reports_first_difference() -> None:
    trace, expected = DATA / "preempt.trace.json", DATA / "preempt.steps.jsonl.gz"
    args = ["replay-steps", str(trace), "--compare", str(expected), "--num-blocks", "140"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 1
    assert "first difference at step 0" in res.output and "expected:" in res.output


def test_flags_override_the_expected_config() -> None:
    config = config_from({"num_blocks": 150, "block_size": 16}, num_blocks=200, watermark=0.01)
    assert config.num_blocks == 200 and config.watermark_blocks == 2


def test_bad_trace_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_len": 10}]))
    with pytest.raises(SimError, match=r"t\.json.*max_tokens"):
        load_trace(path)
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_len": 1, "max_tokens": 1}] * 2))
    with pytest.raises(SimError, match="'id' repeats"):
        load_trace(path)
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_len": 1, "max_tokens": 1, "n": 0}]))
    with pytest.raises(SimError, match=r"t\.json: request 0: field 'n': expected a whole number in \[1,"):
        load_trace(path)
    path.write_text("{not json")
    with pytest.raises(SimError, match=r"t\.json"):
        load_trace(path)
    path.write_text(json.dumps([{"id": "a", "arrival_step": 0, "prompt_len": 5000, "max_tokens": 3}]))
    with pytest.raises(SimError, match="rejected"):
        run(path, None, None, {})


def test_bad_steps_log(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"step": 0}\n')
    with pytest.raises(SimError, match="config"):
        read_steps(path)

"""Step-level replay reproduces vLLM v1's scheduling decisions on the conformance cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sim import cli
from sim.errors import SimError
from sim.replay import compare, config_from, load_trace, read_steps, replay, run

DATA = Path(__file__).parent / "data" / "oracle"
CASES = ["basic", "preempt", "prefix", "no-chunk"]


@pytest.mark.parametrize("case", CASES)
def test_oracle_case_reproduced_step_for_step(case: str) -> None:
    config, expected = read_steps(DATA / f"{case}.steps.jsonl.gz")
    actual = replay(load_trace(DATA / f"{case}.trace.json"), config_from(config))
    result = compare(expected, actual)
    assert result.first_diff is None, result.first_diff
    assert result.share == 1.0


def _app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, whatever other commands exist
    app.command("replay-steps")(cli.replay_steps)
    return app


def test_cli_compare_and_write(tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    args = ["replay-steps", str(DATA / "prefix.trace.json"), "--compare", str(DATA / "prefix.steps.jsonl.gz")]
    res = CliRunner().invoke(_app(), [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "(100.00%)" in res.output
    config, steps = read_steps(out)
    assert config["enable_prefix_caching"] is True and len(steps) == 890


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

"""Scenario files: validation errors name the file and the dotted key; `sim run` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario, parse_override
from sim.cost.replica import build_cost_and_memory
from sim.io.errors import SimError

ROOT = Path(__file__).resolve().parents[1]
CONVOY = ROOT / "scenarios" / "convoy.toml"
SHORT = ["--set", "horizon.duration_s=60"]
runner = CliRunner()


def test_convoy_validates_with_both_policies() -> None:
    sc = load_scenario(CONVOY)
    assert set(sc.policies) == {"static", "continuous"}
    assert sc.policy("static")[0] == "static"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("horizon.duration_s=abc", "horizon.duration_s"),
        ("workload.arrival.rate=-1", "workload.arrival.rate"),
        ("policies.static.max_batch=3", "policies.static.max_batch"),
        ("policies.static.max_batch_size=0", "policies.static.max_batch_size"),
        ("policies.static.scheduler='nope'", "policies.static.scheduler"),
        ("model.gpu_memory_utilization=1.5", "model.gpu_memory_utilization"),
        ("bogus=1", "bogus"),
    ],
)
def test_bad_values_name_file_and_key(override: str, key: str) -> None:
    with pytest.raises(SimError) as err:
        load_scenario(CONVOY, [override])
    assert f"convoy.toml: {key}:" in str(err.value)


def test_override_values_are_read_as_toml() -> None:
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a=[1, 2]") == ("a", [1, 2])
    assert parse_override("a=hello") == ("a", "hello")
    with pytest.raises(SimError):
        parse_override("novalue")


def test_cli_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    for args in (
        ["run", str(CONVOY), "--set", "model.gpu=H1000"],
        ["run", str(tmp_path / "missing.toml")],
        ["run", str(CONVOY), "--set", "workload.arrival.kind='nope'"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit)
    result = runner.invoke(app, ["run", str(CONVOY), "--set", "model.gpu=H1000"])
    assert "model.gpu" in result.output and "did you mean" in result.output


def test_schema_lists_policies() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert {"static", "continuous", "vllm"} <= set(schema["x-policies"])
    assert "workload" in schema["properties"]


def test_run_writes_records_and_is_deterministic(tmp_path: Path) -> None:
    outs = []
    for name in ("a", "b"):
        result = runner.invoke(app, ["run", str(CONVOY), *SHORT, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        outs.append(tmp_path / name)
    for policy in ("static", "continuous"):
        for f in ("requests.parquet", "steps.parquet", "summary.json"):
            assert (outs[0] / policy / f).read_bytes() == (outs[1] / policy / f).read_bytes(), f
    summary = json.loads((outs[0] / "continuous" / "summary.json").read_text())
    counts = summary["requests"]
    assert counts["arrived"] == counts["finished"] + counts["rejected"] + counts["in_flight"]
    for metric in ("queue_wait", "ttft", "itl", "tpot", "e2e"):
        assert set(summary["latency"][metric]) == {"mean", "p50", "p90", "p95", "p99", "max"}
    assert set(summary["throughput"]) == {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}
    requests = pl.read_parquet(outs[0] / "continuous" / "requests.parquet")
    assert requests.height == counts["arrived"]


def test_convoy_continuous_beats_static_at_the_tail(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["run", str(CONVOY), "--set", "horizon.duration_s=300", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    s = {p: json.loads((tmp_path / p / "summary.json").read_text()) for p in ("static", "continuous")}
    for metric in ("ttft", "e2e"):
        assert s["continuous"]["latency"][metric]["p99"] < s["static"]["latency"][metric]["p99"]


def test_equal_lengths_changes_little(tmp_path: Path) -> None:
    scenario = ROOT / "scenarios" / "equal-lengths.toml"
    result = runner.invoke(app, ["run", str(scenario), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    s = {p: json.loads((tmp_path / p / "summary.json").read_text()) for p in ("static", "continuous")}
    st, co = s["static"], s["continuous"]
    assert co["throughput"]["requests_per_s"] == pytest.approx(st["throughput"]["requests_per_s"], rel=0.05)
    assert co["latency"]["e2e"]["p99"] == pytest.approx(st["latency"]["e2e"]["p99"], rel=0.05)


def test_paged_memory_holds_more_sequences_than_reservations(tmp_path: Path) -> None:
    """Same memory, same requests: paged KV runs more sequences at once and wastes under 4% of the cache,
    while reservations leave most of what they hold unused (the vLLM paper's 20.4-38.2% token states)."""
    scenario = ROOT / "scenarios" / "paged-vs-reservation.toml"
    result = runner.invoke(
        app, ["run", str(scenario), "--set", "horizon.duration_s=150", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    s = {p: json.loads((tmp_path / p / "summary.json").read_text()) for p in ("continuous", "vllm")}
    reserved, paged = s["continuous"], s["vllm"]
    assert paged["steps"]["max_batch_size"] > 2 * reserved["steps"]["max_batch_size"]
    assert paged["steps"]["mean_batch_size"] > reserved["steps"]["mean_batch_size"]
    assert paged["kv_memory"]["held_unused"] < 0.04
    assert reserved["kv_memory"]["held_unused"] > reserved["kv_memory"]["token_states"]
    assert reserved["kv_memory"]["token_states"] < 0.4
    for summary in (reserved, paged):
        shares = summary["kv_memory"]
        assert sum(shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('model.tp="2"', "model.tp"),
        ('horizon.drain="yes"', "horizon.drain"),
        ("horizon.max_requests=20.0", "horizon.max_requests"),
        ("workload.output={kind = 'fixed', value = 10.5}", "workload.output.value"),
        ("workload.prompt={kind = 'fixed', value = 100.5}", "workload.prompt.value"),
        ('seed="3"', "seed"),
        ('model.gpu_memory_utilization="0.9"', "model.gpu_memory_utilization"),
        ("policies.static.max_batch_size=4.5", "policies.static.max_batch_size"),
    ],
)
def test_typos_of_type_are_refused_not_coerced(override: str, key: str) -> None:
    """A quoted number, a "yes" for a boolean and a fractional token count are refused, naming the key."""
    with pytest.raises(SimError) as err:
        load_scenario(CONVOY, [override])
    assert f"convoy.toml: {key}:" in str(err.value)


def test_strict_types_keep_toml_numbers_and_whole_floats() -> None:
    """A TOML int where a float is expected, `--set model.tp=2`, and staged arrays still validate."""
    sc = load_scenario(
        CONVOY,
        [
            "model.tp=2",
            "model.gpu_memory_utilization=1",
            "horizon.duration_s=2",
            "workload.arrival={kind = 'staged', stages = [[1, 2], [3.5, 4]]}",
            "workload.output={kind = 'fixed', value = 12.0}",
        ],
    )
    assert sc.model.tp == 2
    assert sc.model.gpu_memory_utilization == 1.0
    assert sc.horizon.duration_s == 2.0
    assert sc.workload.arrival.stages == [(1.0, 2.0), (3.5, 4.0)]
    assert sc.workload.output.value == 12.0


def test_a_long_max_model_len_is_refused_unless_the_scenario_allows_it() -> None:
    """Yi-34B's config gives 4,096 positions; Sarathi-Serve's artifact serves it at 8,192 (its engine forces
    linear RoPE scaling). Refused by default, naming the key that allows it, as vLLM names
    VLLM_ALLOW_LONG_MAX_MODEL_LEN; allowed, the replica is built with the longer length."""
    long = ["model.name='yi-34b'", "model.tp=2", "model.gpu='A100-80GB'", "model.max_model_len=8192"]
    with pytest.raises(SimError, match=r"model.max_model_len: 8192 is longer than yi-34b serves \(4096 "
                       r"positions.*set model.allow_long_max_model_len = true"):  # fmt: skip
        build_cost_and_memory(load_scenario(CONVOY, long), "convoy.toml")
    allowed = load_scenario(CONVOY, [*long, "model.allow_long_max_model_len=true"])
    _, memory, _ = build_cost_and_memory(allowed, "convoy.toml")
    assert memory.max_model_len == 8192 and memory.num_blocks > 0

"""Fidelity against ground-truth vLLM rows: translation, metric definitions, errors, CLI, re-costing."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from sim.cli import app, main
from sim.config.calibration import Calibration
from sim.config.scenario import validate_scenario
from sim.io.errors import SimError
from sim.report.fidelity import bar_misses, bar_text, fidelity_chart
from sim.studies.calibrate import STAGE_MEASURED, fit, params_of, replication_lines, residuals
from sim.studies.calibration_trace import recost, step_seconds, trace_row
from sim.studies.validate import (
    BAR_SCALE,
    CPU_OFFLOAD_NOTE,
    CSV_COLUMNS,
    MEDIAN_BAR_PCT,
    RETOKENIZED_PROMPT_TOKENS,
    GroundTruthRow,
    Prediction,
    compare,
    errors,
    itl_from,
    load_rows,
    median_errors,
    predict,
    row_scenario,
)

ROWS = {r.exp_key: r for r in load_rows()}


def row(prefix: str) -> GroundTruthRow:
    (found,) = [r for k, r in ROWS.items() if k.startswith(prefix)]
    return found


def test_shipped_set_has_all_rows_and_the_overloaded_ones() -> None:
    assert len(ROWS) == 21
    overloaded = sorted(k for k, r in ROWS.items() if r.measured_overloaded)
    assert len(overloaded) == 4 and all(k.endswith("reasoning") for k in overloaded)


def test_fp8_moe_row_translates_knobs() -> None:
    data, notes = row_scenario(row("17-llama-4-scout"))
    m, p, w = data["model"], data["policies"]["vllm"], data["workload"]
    assert m["name"] == "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"
    assert (m["gpu"], m["tp"], m["weight_dtype"], m["num_kv_blocks"]) == ("H100-SXM", 2, "fp8", 8253)
    assert "cpu_offload_blocks" not in m  # cpu_kv_blocks = 0
    assert p == {
        "scheduler": "vllm",
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
    }
    assert w["shared_prefix"]["question_len"] == 447 + RETOKENIZED_PROMPT_TOKENS
    # the row states 9 x 5, multi-turn; the load tool ran its default pool of 10 x 10 prompts, single-turn
    assert w["shared_prefix"]["num_unique_system_prompts"] == 10
    assert w["shared_prefix"]["num_users_per_system_prompt"] == 10
    assert w["ignore_eos"] is True
    assert w["arrival"] == {"kind": "staged", "stages": [[2.5, 600.0], [6.0, 600.0]], "exact_count": True}
    assert notes == [
        "max_model_len 4096 (vLLM default as run)",
        "prompt pool 10 x 10, single-turn, as the load tool ran it (the row states 9 x 5, multi-turn)",
    ]
    validate_scenario(data, "test")


def test_missing_blocks_fall_back_to_memory() -> None:
    data, notes = row_scenario(row("20260217-202857"))  # Llama-2-70B TP4, no block counts
    assert "num_kv_blocks" not in data["model"] and data["model"]["gpu_memory_utilization"] == 0.9
    assert data["model"]["max_model_len"] == 4096
    assert any("gpu_mem_util 0.9" in n for n in notes)
    data, _ = row_scenario(row("60-llama-3-1-70b"))
    assert data["model"]["tp"] == 4
    assert data["policies"]["vllm"]["max_num_batched_tokens"] == 8192
    assert "weight_dtype" not in data["model"]


def test_scale_shortens_stages_and_keeps_the_mix() -> None:
    data, _ = row_scenario(row("61-llama"), scale=0.1)
    assert data["workload"]["arrival"]["stages"] == [[5.0, 60.0], [10.0, 60.0]]


def test_cpu_offload_rows_get_no_extra_gpu_blocks() -> None:
    """vLLM's CPU KV offloading is a host-memory prefix tier: its blocks never hold running sequences."""
    for key, r in ROWS.items():
        data, notes = row_scenario(r)
        assert "cpu_offload_blocks" not in data["model"], key
        assert (CPU_OFFLOAD_NOTE in notes) == (r.get("cpu_offload") == "True"), key
    data, _ = row_scenario(row("20260217-162547"))  # Llama-2-7B, 7,463 GPU blocks and 1,023 CPU blocks
    assert data["model"]["num_kv_blocks"] == 7463
    assert validate_scenario(data, "test").model.num_kv_blocks == 7463


def test_a_scenario_asking_for_cpu_offload_blocks_is_refused_with_the_reason() -> None:
    """Offloaded KV blocks were once added to the GPU's; they are refused now, never silently ignored."""
    data, _ = row_scenario(row("20260217-162547"))
    data["model"]["cpu_offload_blocks"] = 1023
    with pytest.raises(SimError, match=r"cpu_offload_blocks: host-memory KV offloading is not modelled"):
        validate_scenario(data, "test")


def test_rows_the_simulator_saturates_stay_in_the_steady_state_medians() -> None:
    """Only the measurement decides that a row was overloaded; a saturated prediction counts (its error)."""
    r = row("62-mistral")
    measured = r.measured()
    blown = Prediction(r.exp_key, {m: v * 13.79 for m, v in measured.items()}, overloaded=True)
    frame = compare([r], [blown])
    assert not frame["overloaded"].any() and frame["sim_overloaded"].all()
    med = median_errors(frame).filter(pl.col("metric") == "ttft_mean").row(0, named=True)
    assert med["overloaded"] is False and med["median_ape_pct"] == pytest.approx(1279.0)
    assert f"ttft_mean 1279.0% > {MEDIAN_BAR_PCT['ttft_mean']:g}%" in bar_misses(frame)
    failed = Prediction(r.exp_key, dict.fromkeys(measured, math.nan), overloaded=True)
    assert median_errors(compare([r], [failed]))["median_ape_pct"].to_list() == [math.inf] * 7
    exact = Prediction(r.exp_key, measured, overloaded=False)
    assert bar_misses(compare([r], [exact])) == ""


def test_bad_rows_are_user_errors(tmp_path: Path) -> None:
    bad = GroundTruthRow("x", {**row("62-mistral").fields, "precision": "INT3"})
    with pytest.raises(SimError, match="precision"):
        row_scenario(bad)
    with pytest.raises(SimError, match="cannot read"):
        load_rows(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("e2e_mean_ms", "0", "e2e_mean_ms must be > 0 (got 0)"),  # the relative errors divided by it
        ("ttft_p99_ms", "-3", "ttft_p99_ms must be > 0 (got -3)"),
        ("e2e_p90_ms", "nan", "e2e_p90_ms='nan' is not a finite number"),
    ],
)
def test_measurements_that_are_no_latency_are_refused(field: str, value: str, message: str) -> None:
    bad = GroundTruthRow("x", {**row("62-mistral").fields, field: value})
    with pytest.raises(SimError, match=re.escape(f"ground truth row x: {message}")):
        bad.measured()


def test_tp_zero_is_refused_not_read_as_one() -> None:
    bad = GroundTruthRow("x", {**row("62-mistral").fields, "tp": "0"})
    with pytest.raises(SimError, match=re.escape("ground truth row x: model.tp: Input should be greater")):
        validate_scenario(row_scenario(bad)[0], "ground truth row x")


def test_itl_is_the_measurements_definition_with_the_generated_length() -> None:
    r = row("20260217-155451")  # the load tool counted 195 output tokens of 247
    m = r.measured()
    assert m["itl_mean"] == pytest.approx((2080.74 - 27.9818) / 246)
    reported = (2080.74 - 27.9818) / (195.09 - 1)
    assert float(r.get("itl_mean_ms")) == pytest.approx(reported, rel=1e-4)
    assert itl_from(10.0, 2.0, 5) == 2.0 and math.isnan(itl_from(1.0, 1.0, 1))


def test_error_maths_and_medians() -> None:
    assert errors(110.0, 100.0) == pytest.approx((10.0, 10.0))
    assert errors(80.0, 100.0) == pytest.approx((20.0, -20.0))
    frame = pl.DataFrame(
        [("a", "e2e_mean", 0, 0, 10.0, -10.0, False, False), ("b", "e2e_mean", 0, 0, 30.0, 30.0, False, True),
         ("c", "e2e_mean", 0, 0, 20.0, 20.0, False, False), ("d", "e2e_mean", 0, 0, 90.0, -90.0, True, True)],
        schema=list(CSV_COLUMNS), orient="row",
    )  # fmt: skip
    med = median_errors(frame)
    steady = med.filter(~pl.col("overloaded")).row(0, named=True)
    assert (steady["median_ape_pct"], steady["median_signed_pct"], steady["rows"]) == (20.0, 20.0, 3)
    assert med.filter(pl.col("overloaded"))["median_ape_pct"].item() == 90.0


def test_cli_tiny_row_writes_fidelity_csv_and_html(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "validate",
            "ground-truth",
            "--row",
            "62-mistral",
            "--scale",
            "0.02",
            "--jobs",
            "1",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "median over rows" in res.output and "steady state (1)" in res.output
    frame = pl.read_csv(tmp_path / "fidelity.csv")
    assert tuple(frame.columns) == CSV_COLUMNS
    assert frame.height == 7 and not frame["overloaded"].any()
    e2e = frame.filter(pl.col("metric") == "e2e_mean").row(0, named=True)
    assert 0.5 < e2e["predicted_ms"] / e2e["measured_ms"] < 2.0
    assert "vega" in (tmp_path / "fidelity.html").read_text()


def test_cli_unknown_target_is_a_user_error() -> None:
    res = CliRunner().invoke(app, ["validate", "nonsense"])
    assert res.exit_code == 2 and "unknown target" in res.output


def test_shortened_reasoning_row_is_overloaded() -> None:
    pred = predict(row("20260217-170634"), scale=0.05)  # Llama-2-7B at 4 req/s of 1,448 tokens
    assert pred.overloaded
    assert pred.predicted["ttft_mean"] > 10_000


@pytest.fixture(scope="module")
def tiny_trace():  # type: ignore[no-untyped-def]
    return trace_row(row("62-mistral"), 0.02, {})


def test_recost_reproduces_the_simulation(tiny_trace) -> None:  # type: ignore[no-untyped-def]
    cal = Calibration.load()
    assert np.allclose(step_seconds(tiny_trace, cal), tiny_trace.duration, rtol=1e-9, atol=1e-12)
    sim = predict(row("62-mistral"), 0.02, params_of(cal, 0.0)).predicted
    again = recost(tiny_trace, cal)
    for metric, value in sim.items():
        assert again[metric] == pytest.approx(value, rel=1e-9)


def test_fit_recovers_a_known_calibration(tiny_trace) -> None:  # type: ignore[no-untyped-def]
    truth = replace(Calibration.load(), bandwidth_eff=0.6, step_overhead_s=1e-3)
    target = recost(tiny_trace, truth)
    synthetic = replace(tiny_trace, measured=target)
    got = fit([synthetic], params_of(Calibration.load(), 0.0), names=("bandwidth_eff", "step_overhead_s"))
    assert got["bandwidth_eff"] == pytest.approx(0.6, rel=0.05)
    assert got["step_overhead_s"] == pytest.approx(1e-3, rel=0.1)


def test_frontend_overhead_adds_to_ttft_and_e2e(tiny_trace) -> None:  # type: ignore[no-untyped-def]
    base = recost(tiny_trace, params_of(Calibration.load(), 0.0))
    more = recost(tiny_trace, params_of(Calibration.load(), 0.02))
    assert more["ttft_mean"] - base["ttft_mean"] == pytest.approx(20.0)
    assert more["e2e_p99"] - base["e2e_p99"] == pytest.approx(20.0)
    assert more["itl_mean"] == pytest.approx(base["itl_mean"])


def test_a_rows_workload_seed_reaches_its_simulation(tiny_trace) -> None:  # type: ignore[no-untyped-def]
    assert row_scenario(row("62-mistral"))[0]["seed"] == 0
    assert row_scenario(row("62-mistral"), seed=3)[0]["seed"] == 3
    other = trace_row(row("62-mistral"), 0.02, {}, seed=1)
    assert len(other.arrival) and not np.array_equal(other.arrival[:5], tiny_trace.arrival[:5])


def test_replicated_figures_are_means_with_student_t_intervals() -> None:
    (line,) = replication_lines([{"e2e_mean": (2.0, -1.0, 12.0)}, {"e2e_mean": (4.0, 1.0, 14.0)}])
    # two seeds: mean 13, standard error 1, t(0.975, 1) = 12.706
    assert line == "e2e_mean: median 3.0% [-9.7, 15.7], p90 13.0% [0.3, 25.7] (each seed's p90: 12.0, 14.0)"


def test_calibrate_needs_at_least_one_seed() -> None:
    res = CliRunner().invoke(app, ["calibrate", "--seeds", "0"])
    assert res.exit_code == 2 and "--seeds" in res.output


def test_two_stage_rows_are_fitted_per_stage(tiny_trace) -> None:  # type: ignore[no-untyped-def]
    params = params_of(Calibration.load(), 0.0)
    assert len(residuals(params, [tiny_trace])) == 4  # whole run: E2E and TTFT mean and p90
    staged = replace(tiny_trace, exp_key=next(iter(STAGE_MEASURED)))
    assert staged.stage0_end_s > 0 and (staged.arrival < staged.stage0_end_s).any()
    assert len(residuals(params, [staged])) == 8  # the same four per stage


def _ten_percent_off(rows, scale, cal, jobs, done):  # type: ignore[no-untyped-def]
    return [Prediction(r.exp_key, {m: v * 1.1 for m, v in r.measured().items()}, False) for r in rows]


@pytest.mark.parametrize("scale", ["1", "0.05"])
def test_the_bar_is_not_judged_at_a_scale_it_was_not_measured_at(
    scale: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEDIAN_BAR_PCT holds at --scale BAR_SCALE only: elsewhere the medians are shown, exit 0, and the
    output says at which scale the bar applies."""
    monkeypatch.setattr("sim.report.fidelity.predict_all", _ten_percent_off)
    res = CliRunner().invoke(app, ["validate", "ground-truth", "--scale", scale, "--jobs", "1"])
    text = re.sub(r"\s+", " ", res.output)
    assert res.exit_code == 0, res.output
    assert "median over rows" in text
    assert f"the bar ({bar_text()}) applies at --scale {BAR_SCALE:g}" in text


def test_the_bar_is_judged_at_the_scale_it_was_measured_at(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sim.report.fidelity.predict_all", _ten_percent_off)
    res = CliRunner().invoke(app, ["validate", "ground-truth", "--scale", f"{BAR_SCALE:g}", "--jobs", "1"])
    assert res.exit_code == 2 and "median above the README's bar" in res.output, res.output


def _frame_ten_percent_off() -> pl.DataFrame:
    rows = load_rows()
    return compare(rows, _ten_percent_off(rows, 1.0, None, 1, None))


def test_the_comparison_says_how_many_simulated_requests_each_prediction_covers() -> None:
    """A row's predicted latencies cover only the simulated requests that finished within the client
    timeout: the table says how many, per row."""
    import io

    from rich.console import Console

    from sim.report.fidelity import print_report

    rows = load_rows()[:2]
    preds = [
        replace(p, finished=done, arrived=1200)
        for p, done in zip(_ten_percent_off(rows, 1.0, None, 1, None), (1200, 1180), strict=True)
    ]
    screen = Console(file=io.StringIO(), width=300)
    print_report(rows, preds, compare(rows, preds), screen)
    text = screen.file.getvalue()  # type: ignore[attr-defined]
    assert "predicted over" in text and "1,200 of 1,200 (all)" in text
    assert "1,180 of 1,200 (20 unfinished or timed out)" in text


def test_fidelity_page_fits_a_screen_with_its_legend_inside() -> None:
    """Seven 300-px facets in four columns put the legend past 1,400 px, off a laptop screen."""
    import vl_convert as vlc

    spec = fidelity_chart(_frame_ten_percent_off(), "verdict").to_dict()
    svg = vlc.vegalite_to_svg(spec)
    width = float(re.search(r'<svg[^>]* width="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert width <= 1100, width
    legend = spec["spec"]["layer"][0]["encoding"]["color"]["legend"]
    assert legend["orient"] in ("top", "bottom")


def test_fidelity_page_states_that_the_run_missed_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.report.fidelity.predict_all", _ten_percent_off)
    args = ["validate", "ground-truth", "--scale", f"{BAR_SCALE:g}", "--jobs", "1", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    html = (tmp_path / "fidelity.html").read_text()
    assert f"Missed the bar: steady-state median e2e_mean 10.0% > {MEDIAN_BAR_PCT['e2e_mean']:g}%" in html
    assert "steady-state median absolute error: e2e_mean 10.0%, ttft_mean 10.0%, itl_mean 10.0%" in html


def test_fidelity_page_states_when_the_bar_was_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.report.fidelity.predict_all", _ten_percent_off)
    args = ["validate", "ground-truth", "--scale", "1", "--jobs", "1", "--out", str(tmp_path)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert f"applies at --scale {BAR_SCALE:g}" in (tmp_path / "fidelity.html").read_text()


@pytest.mark.parametrize(
    "content",
    [bytes(range(256)) * 4, b"\xff\xfeexp_key,model_hf\n", b"exp_key,model_hf\nx\x00y,z\n"],
    ids=["random bytes", "utf-16 mark", "nul byte"],
)
def test_a_binary_ground_truth_csv_is_one_error_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    """A ground-truth CSV that is not UTF-8 text (or holds a NUL byte) is a user error naming the file,
    for `load_rows` and for `sim validate` and `sim calibrate`, never a UnicodeDecodeError."""
    path = tmp_path / "binary.csv"
    path.write_bytes(content)
    with pytest.raises(SimError, match=re.escape(str(path))):
        load_rows(path)
    for args in (["validate", "ground-truth", str(path)], ["calibrate", str(path)]):
        with pytest.raises(SystemExit) as stop:
            main(args)
        stderr = capsys.readouterr().err
        assert stop.value.code == 2, stderr
        (line,) = stderr.splitlines()
        assert line.startswith("error: ") and str(path) in line, line

"""`sim report`: chart data (timeline, bins, KV split, CIs, capacity) and the offline HTML page."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.records import stats
from sim.report.build import build_report, capacities, frames, grid, run_sections, sweep_sections
from sim.report.headline import capacity_sentence
from sim.report.inputs import PolicyRun, ReportInputs, load_inputs
from sim.report.slo import judge_by_page_slo
from sim.studies.points import POINT_SCHEMA
from sim.studies.run import run_policy, write_result

SCENARIO = """
name = "mini"
description = "Static vs continuous batching on a tiny chat workload"
seed = 3

[model]
name = "llama-2-7b"
gpu = "A100-80GB"

[workload]
arrival = { kind = "poisson", rate = 3.0 }
prompt = { kind = "lognormal", mean = 200, cv = 1.0, min = 8, max = 1024 }
output = { kind = "lognormal", mean = 120, cv = 1.5, min = 2, max = 512 }
max_tokens = 512

[horizon]
duration_s = 40

[slo]
ttft_s = 1.0
tpot_s = 0.1

[policies.static]
scheduler = "static"
max_batch_size = 8

[policies.continuous]
scheduler = "continuous"
max_num_seqs = 8
"""

RATES = (1.0, 2.0, 4.0, 8.0)
HELD = {"continuous": 4.0, "static": 1.0}  # the highest rate each policy passes in the synthetic sweep
CHARTS = ("latency_vs_rate", "throughput_vs_rate", "goodput_vs_rate", "latency_cdf", "convoy_timeline",
          "utilisation", "kv_breakdown")  # fmt: skip


def point_row(policy: str, rate: float, replication: int) -> dict[str, Any]:
    """One synthetic sweep point: latency is flat up to the policy's capacity, then explodes."""
    ok = rate <= HELD[policy]
    jitter = 1.0 + 0.05 * replication
    row: dict[str, Any] = {name: None for name in POINT_SCHEMA}
    row.update(
        point_key=f"{policy}-{rate}-{replication}", policy=policy, scheduler=policy, rate=rate,
        replication=replication, seed_entropy="1", spawn_key=[replication], params="{}",
        arrived=int(rate * 100), finished=int(rate * 100 if ok else rate * 50), rejected=0, in_flight=0,
        overloaded=not ok, requests_per_s=rate if ok else HELD[policy] * 1.2,
        output_tokens_per_s=rate * 100, total_tokens_per_s=rate * 300,
        goodput_per_s=rate if ok else 0.1, slo_attainment=1.0 if ok else 0.05,
        mean_batch_size=4.0, mean_kv_utilization=0.3, preemptions=0, prefix_cache_hit_rate=0.0,
    )  # fmt: skip
    for metric in ("queue_wait", "ttft", "itl", "tpot", "e2e"):
        for s in ("mean", "p50", "p90", "p95", "p99", "max"):
            base = {"ttft": 0.2, "tpot": 0.02, "itl": 0.02, "e2e": 3.0, "queue_wait": 0.01}[metric]
            row[f"{metric}_{s}"] = base * jitter * (1.0 if ok else 50.0) * (2.0 if s != "p50" else 1.0)
    return row


def write_sweep(report_dir: Path, scenario_file: Path, with_capacity: bool = True) -> None:
    points = report_dir / "sweep" / "points"
    points.mkdir(parents=True)
    for policy in HELD:
        for rate in RATES:
            for rep in range(2):
                row = point_row(policy, rate, rep)
                pl.DataFrame([row], schema=POINT_SCHEMA).write_parquet(points / f"{row['point_key']}.parquet")
    if with_capacity:
        caps = [
            {"policy": p, "params": {}, **stats.grid_capacity({r: r <= held for r in RATES}).as_dict()}
            for p, held in HELD.items()
        ]
        (report_dir / "sweep" / "capacity.json").write_text(json.dumps({"capacities": caps}))
    from sim.config.scenario import read_toml

    manifest = {"fingerprint": "x", "scenario": read_toml(scenario_file)}
    (report_dir / "sweep" / "manifest.json").write_text(json.dumps(manifest))


def make_report_dir(root: Path, runs: bool = True, sweep: bool = True) -> Path:
    """reports/mini/ with real short runs of both policies and a synthetic sweep."""
    scenario_file = root / "mini.toml"
    scenario_file.write_text(SCENARIO)
    report_dir = root / "reports" / "mini"
    report_dir.mkdir(parents=True)
    if runs:
        sc = load_scenario(scenario_file)
        for policy in sc.policies:
            write_result(run_policy(sc, policy, root), report_dir)
    if sweep:
        write_sweep(report_dir, scenario_file)
    return report_dir


@pytest.fixture(scope="module")
def full_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    report_dir = make_report_dir(tmp_path_factory.mktemp("full"))
    return report_dir, build_report(report_dir, png=True)


def test_full_report_writes_page_and_a_png_per_chart(full_report: tuple[Path, list[Path]]) -> None:
    report_dir, written = full_report
    index = report_dir / "index.html"
    assert written[0] == index
    assert sorted(p.name for p in written[1:]) == sorted(f"{c}.png" for c in CHARTS)
    for png in written[1:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    html = index.read_text()
    assert not re.search(r"<script[^>]+src=", html), "scripts must be inlined"
    assert "vegaEmbed" in html and len(html) > 500_000  # vega, vega-lite and vega-embed are inlined
    for chart in CHARTS:
        assert f'data-chart="{chart}"' in html
    assert "Static vs continuous batching on a tiny chat workload" in html
    assert "continuous holds 4.0× the arrival rate of static" in html
    assert 'class="missing"' not in html


def test_every_chart_is_a_valid_vega_lite_spec(full_report: tuple[Path, list[Path]]) -> None:
    inputs = load_inputs(full_report[0])
    series = ["continuous", "static"]
    sections = sweep_sections(inputs, series, capacities(inputs)) + run_sections(inputs, series)
    assert [s.key for s in sections] == list(CHARTS)
    for section in sections:
        assert section.chart is not None
        section.chart.to_dict(validate=True)  # raises on a spec that breaks the schema


def test_runs_only_says_the_sweep_charts_need_sim_sweep(tmp_path: Path) -> None:
    report_dir = make_report_dir(tmp_path, sweep=False)
    build_report(report_dir, tmp_path / "mini.toml", png=False)
    html = (report_dir / "index.html").read_text()
    assert html.count('class="missing"') == 3 and "sim sweep" in html
    assert html.count("data-chart=") == 4
    assert "At 3 req/s, continuous keeps p99 TTFT" in html
    assert not (report_dir / "charts").exists()


def test_the_missing_charts_hint_names_the_folder_the_page_reads(tmp_path: Path) -> None:
    """A page made from runs written with `--out` used to say `sim sweep SCENARIO.toml`, which writes the
    sweep to reports/<scenario>/, not beside the runs: the hint names the folder the page was read from."""
    for root in ("runs", "sweep"):
        (tmp_path / root).mkdir()
    runs_only = make_report_dir(tmp_path / "runs", sweep=False)
    custom = tmp_path / "elsewhere"
    runs_only.rename(custom)
    build_report(custom, tmp_path / "runs" / "mini.toml", png=False)
    html = (custom / "index.html").read_text()
    assert html.count(f"<code>sim sweep SCENARIO.toml --out {custom}</code>") == 3
    sweep_only = make_report_dir(tmp_path / "sweep", runs=False)
    build_report(sweep_only, tmp_path / "sweep" / "mini.toml", png=False)
    html = (sweep_only / "index.html").read_text()
    assert f"<code>sim run SCENARIO.toml --out {sweep_only}</code>" in html


def test_sweep_only_renders_sweep_charts(tmp_path: Path) -> None:
    report_dir = make_report_dir(tmp_path, runs=False)
    build_report(report_dir, png=False)
    html = (report_dir / "index.html").read_text()
    assert html.count("data-chart=") == 3 and html.count('class="missing"') == 4 and "sim run" in html
    assert "mini" in html  # the scenario comes from the sweep manifest


def test_nothing_to_report_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(SimError, match="no run records"):
        load_inputs(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output


# --- chart data ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(full_report: tuple[Path, list[Path]]) -> list[PolicyRun]:
    return load_inputs(full_report[0]).runs


def test_last_token_is_finish_time_without_padding(runs: list[PolicyRun]) -> None:
    cont = next(r for r in runs if r.policy == "continuous").requests.filter(pl.col("state") == "finished")
    derived = cont.select(frames.last_token_at(cont))["last_token_at"].to_numpy()
    np.testing.assert_allclose(derived, cont["finished_at"].to_numpy(), rtol=0, atol=1e-9)


def test_timeline_shows_padding_only_for_static(runs: list[PolicyRun]) -> None:
    seg = frames.timeline(runs, 20)
    assert seg["id"].n_unique() == 20
    assert set(seg["policy"]) == {"static", "continuous"}
    assert seg.filter(pl.col("policy") == "continuous", pl.col("segment") == "padding").is_empty()
    static_pad = seg.filter(pl.col("policy") == "static", pl.col("segment") == "padding")
    assert static_pad.height > 0
    assert (seg["end"] > seg["start"]).all()
    # A request's segments tile [arrival, response] without gaps or overlaps.
    for (_, _), g in seg.group_by("policy", "id"):
        g = g.sort("start")
        np.testing.assert_allclose(g["start"][1:].to_numpy(), g["end"][:-1].to_numpy(), atol=1e-9)


def test_bin_averages_split_a_step_across_bins() -> None:
    # value 4 from t=1 to t=3, value 2 from t=5 to t=6; bins of width 2 over [0, 8).
    out = frames.bin_averages(
        np.array([1.0, 5.0]), np.array([2.0, 1.0]), np.array([4.0, 2.0]), np.array([0.0, 2, 4, 6, 8])
    )
    np.testing.assert_allclose(out, [2.0, 2.0, 1.0, 0.0])


def test_kv_shares_are_time_weighted_and_sum_to_one() -> None:
    steps = pl.DataFrame(
        {
            "start": [0.0, 1.0],
            "duration": [1.0, 3.0],
            "kv_used": [10, 50],
            "kv_allocated": [20, 50],
            "kv_capacity": [100, 100],
            "batch_size": [1, 1],
            "waiting": [0, 0],
        }  # fmt: skip
    )
    run = PolicyRun("p", pl.DataFrame(), steps, {})
    shares = dict(frames.kv_shares([run]).select("part", "share").iter_rows())
    assert shares == pytest.approx({"token states": 0.4, "reserved, unused": 0.025, "free": 0.575})


def test_cdf_is_monotone_and_spans_the_data(runs: list[PolicyRun]) -> None:
    cdf = frames.cdfs(runs)
    for (_, _), g in cdf.group_by("policy", "metric"):
        assert g["value"].is_sorted() and g["fraction"][0] == 0 and g["fraction"][-1] == 1


# --- sweep data and capacity ---------------------------------------------------------------------------


def test_summarize_points_means_and_intervals() -> None:
    points = pl.DataFrame([point_row("static", 1.0, r) for r in range(2)], schema=POINT_SCHEMA)
    out = grid.summarize_points(points, ["ttft_p99"]).row(0, named=True)
    values = [0.4, 0.42]
    mean, low, high, n = stats.mean_ci(values)
    assert (out["mean"], out["ci_low"], out["ci_high"], out["n"]) == pytest.approx((mean, low, high, n))
    assert out["series"] == "static"


def test_series_name_policies_swept_over_several_settings() -> None:
    frame = pl.DataFrame(
        {"policy": ["a", "a", "b"], "params": ['{"max_num_seqs": 8}', '{"max_num_seqs": 16}', "{}"]}
    )
    assert grid.with_series(frame)["series"].to_list() == ["a max_num_seqs=8", "a max_num_seqs=16", "b"]


def test_capacity_from_grid_and_from_capacity_json_agree(tmp_path: Path) -> None:
    report_dir = make_report_dir(tmp_path, runs=False)
    inputs = load_inputs(report_dir)
    from_json = capacities(inputs)
    inputs.capacity = None
    from_grid = capacities(inputs)
    for marks in (from_json, from_grid):
        assert [(m.series, m.rate, m.bound) for m in marks] == [
            ("continuous", 4.0, "within"),
            ("static", 1.0, "within"),
        ]


def test_capacity_bounds_and_headline() -> None:
    above = grid.capacity_from_json(
        {"capacities": [{"policy": "a", **stats.grid_capacity({1.0: True}).as_dict()}]}
    )
    below = grid.capacity_from_json(
        {"capacities": [{"policy": "b", **stats.grid_capacity({2.0: False}).as_dict()}]}
    )
    assert (above[0].rate, above[0].bound, above[0].label) == (1.0, "at_least", "≥ 1 req/s")
    assert (below[0].rate, below[0].bound, below[0].label) == (2.0, "below", "< 2 req/s")
    sentence = capacity_sentence([above[0], grid.CapacityMark("c", 0.25)], None)
    assert sentence is not None and sentence.startswith("a holds at least 4.0× the arrival rate of c")
    assert capacity_sentence(above, None) is None


def test_latency_bands_on_the_log_axis_are_computed_in_log_space() -> None:
    """Replications 5, 20 and 40 s: the linear 95% interval reaches below zero, which a log axis used to
    draw down to its 1e-4 s floor. The band is mean ×/÷ exp(t·s/√n / mean) (delta method for log(mean))."""
    from scipy import stats as sps

    from sim.report import charts

    values = [5.0, 20.0, 40.0]
    rows = [point_row("static", 1.0, r) | {"replication": r, "ttft_p99": v} for r, v in enumerate(values)]
    means = grid.summarize_points(pl.DataFrame(rows, schema=POINT_SCHEMA), ["ttft_p99"])
    mean = float(np.mean(values))
    half = float(sps.t.ppf(0.975, 2)) * float(np.std(values, ddof=1)) / np.sqrt(3)
    assert mean - half < 0  # the linear interval is useless on a log axis
    band = grid.log_bands(means).row(0, named=True)
    factor = np.exp(half / mean)
    assert (band["ci_low"], band["mean"], band["ci_high"]) == pytest.approx(
        (mean / factor, mean, mean * factor)
    )
    spec = charts.latency_vs_rate(grid.log_bands(means), ["static"]).to_dict(validate=False)
    (data,) = spec["datasets"].values()
    assert min(d["ci_low"] for d in data) == pytest.approx(mean / factor)  # not the 1e-4 floor


def test_sweep_report_draws_log_space_bands(full_report: tuple[Path, list[Path]]) -> None:
    inputs = load_inputs(full_report[0])
    (latency,) = [
        s for s in sweep_sections(inputs, ["continuous", "static"], []) if s.key == "latency_vs_rate"
    ]
    assert latency.chart is not None
    (data,) = latency.chart.to_dict(validate=False)["datasets"].values()
    for d in data:
        assert d["ci_low"] > 0 and d["ci_low"] * d["ci_high"] == pytest.approx(d["mean"] ** 2)


def _drawn_line_at(points: list[tuple[float, float]], x: float, log: bool) -> float:
    """What a line through `points` reads at `x`, drawn as straight segments between them on screen (a log
    x axis puts each point at log(x), the linear y axis at y): Vega-Lite's linear interpolation."""
    pos = np.log if log else (lambda v: v)
    xs, ys = zip(*sorted(points), strict=True)
    return float(np.interp(pos(x), pos(np.array(xs)), np.array(ys)))


def _diagonal(spec: dict[str, Any]) -> tuple[list[tuple[float, float]], bool]:
    """The offered-load line of a throughput chart's spec (its points) and whether its rate axis is log."""
    (diagonal,) = [layer for layer in spec["layer"] if layer.get("mark", {}).get("strokeDash")]
    values = (
        diagonal["data"]["values"]
        if "values" in diagonal["data"]
        else spec["datasets"][diagonal["data"]["name"]]
    )
    scales = [
        layer["encoding"]["x"].get("scale", {})
        for outer in spec["layer"]
        for layer in outer.get("layer", [outer])
    ]
    return [(v["rate"], v["mean"]) for v in values], any(s.get("type") == "log" for s in scales)


@pytest.mark.parametrize(
    "rates", [(0.5, 1.0, 2.0, 4.0, 8.0), (0.0625, 0.25, 1.0, 4.0, 12.0), (1.0, 2.0, 4.0)]
)
def test_offered_load_line_reads_y_equals_x_on_the_rate_axis(rates: tuple[float, ...]) -> None:
    """The dashed diagonal of the throughput chart is y = x wherever it is drawn and wherever a reader
    looks between its points, on the log rate axis of a wide grid as on a linear one: at 1 req/s it reads
    1 req/s (a two-point line on a log axis read 2.38 there for rates 0.5 to 8)."""
    from sim.report import charts

    frame = pl.DataFrame(
        {
            "series": ["a"] * len(rates),
            "rate": list(rates),
            "metric": ["requests_per_s"] * len(rates),
            "mean": [min(r, 3.0) for r in rates],
            "ci_low": [0.0] * len(rates),
            "ci_high": [min(r, 3.0) for r in rates],
            "n": [2] * len(rates),
        }  # fmt: skip
    )
    spec = charts.throughput_vs_rate(frame, ["a"]).to_dict(validate=True)
    points, log = _diagonal(spec)
    assert log == (max(rates) >= 10 * min(rates))
    assert all(y == x for x, y in points)
    assert min(x for x, _ in points) == min(rates) and max(x for x, _ in points) == max(rates)
    assert _drawn_line_at(points, 1.0, log) == pytest.approx(1.0, rel=1e-12)
    for rate in rates:
        assert _drawn_line_at(points, rate, log) == pytest.approx(rate, rel=1e-12)
    for x in np.geomspace(min(rates), max(rates), 997):
        assert _drawn_line_at(points, float(x), log) == pytest.approx(x, rel=1e-3)


# --- one SLO per page ------------------------------------------------------------------------------------

STRICT = SCENARIO.replace("ttft_s = 1.0", "ttft_s = 0.01")  # the same scenario judged by TTFT ≤ 10 ms


def _judged(run: PolicyRun, ttft_s: float, tpot_s: float) -> tuple[float, float]:
    """Goodput and SLO attainment of a run's records under TTFT ≤ ttft_s and TPOT ≤ tpot_s, by hand."""
    done = run.requests.filter(pl.col("state") == "finished")
    good = done.filter((pl.col("ttft") <= ttft_s) & (pl.col("tpot").fill_null(0.0) <= tpot_s)).height
    return good / run.summary["window_s"], good / done.height


def test_report_under_another_slo_recomputes_every_figure_it_states(tmp_path: Path) -> None:
    """`sim report --scenario` with a stricter SLO than the records were judged by: the page stated
    "TTFT ≤ 10 ms" beside the runs' 100% attainment under TTFT ≤ 1 s and the sweep's capacities and goodput
    under it. Now it says it recomputes, and every SLO figure on it is judged by the SLO it states: the
    runs' goodput and attainment from their requests, the capacities on the sweep's grid; the sweep's
    goodput, which its points cannot recompute, is left out with the reason."""
    report_dir = make_report_dir(tmp_path)
    strict = tmp_path / "strict.toml"
    strict.write_text(STRICT)
    recorded = {
        r.policy: (r.summary["goodput_per_s"], r.summary["slo_attainment"])
        for r in load_inputs(report_dir).runs
    }
    build_report(report_dir, strict, png=False)
    html = (report_dir / "index.html").read_text()
    assert "SLO: TTFT ≤ 10 ms, TPOT ≤ 100 ms" in html and "TTFT ≤ 1 s" in html  # both named, in the note
    assert 'class="note"' in html and "recomputed" in html

    inputs = load_inputs(report_dir, strict)
    judge_by_page_slo(inputs)
    for run in inputs.runs:
        goodput, attained = _judged(run, 0.01, 0.1)
        assert (run.summary["goodput_per_s"], run.summary["slo_attainment"]) == pytest.approx(
            (goodput, attained)
        )
        assert attained < recorded[run.policy][1]  # the records' own figures are not what the page shows
        assert f"{attained:.1%}" in html
    for policy, (_, attained) in recorded.items():
        assert f"<td>{attained:.1%}</td>" not in html, policy
    caps = capacities(inputs)
    assert inputs.capacity is None  # capacity.json was bisected under TTFT ≤ 1 s
    assert points_capacity(inputs.points, 0.01, 0.1) == [(m.series, m.rate, m.bound) for m in caps]
    assert [(m.series, m.bound) for m in caps] == [("continuous", "below"), ("static", "below")]
    (goodput,) = [
        s for s in sweep_sections(inputs, ["continuous", "static"], caps) if s.key == "goodput_vs_rate"
    ]
    assert goodput.chart is None and "TTFT ≤ 1 s" in goodput.missing and "TTFT ≤ 10 ms" in goodput.missing
    assert "continuous holds" not in html  # the capacity headline under TTFT ≤ 1 s is gone


def points_capacity(
    points: pl.DataFrame | None, ttft_s: float, tpot_s: float
) -> list[tuple[str, float | None, str]]:
    assert points is not None
    marks = grid.capacity_from_grid(points, stats.SloBounds(ttft_s, tpot_s, None))
    return [(m.series, m.rate, m.bound) for m in marks]


def test_report_under_the_records_own_slo_states_their_figures_unchanged(tmp_path: Path) -> None:
    """With no --scenario, or one of the same SLO, nothing is recomputed and no note says otherwise."""
    report_dir = make_report_dir(tmp_path)
    for scenario_file in (None, tmp_path / "mini.toml"):
        inputs = load_inputs(report_dir, scenario_file)
        before = [dict(r.summary) for r in inputs.runs]
        judge_by_page_slo(inputs)
        assert [r.summary for r in inputs.runs] == before and inputs.notes == [] and inputs.withheld == {}
        assert inputs.capacity is not None


def test_runs_judged_by_another_slo_than_the_sweep_are_recomputed_under_the_page_slo(tmp_path: Path) -> None:
    """Runs made under TTFT ≤ 10 ms beside a sweep under TTFT ≤ 1 s: the page states the sweep's SLO, so
    the runs' attainment is recomputed under it, and the page says so."""
    report_dir = make_report_dir(tmp_path, sweep=False)
    strict = tmp_path / "strict.toml"
    strict.write_text(STRICT)
    sc = load_scenario(strict)
    for policy in sc.policies:
        write_result(run_policy(sc, policy, tmp_path), report_dir)
    write_sweep(report_dir, tmp_path / "mini.toml")
    inputs = load_inputs(report_dir)
    judge_by_page_slo(inputs)
    for run in inputs.runs:
        assert (run.summary["goodput_per_s"], run.summary["slo_attainment"]) == pytest.approx(
            _judged(run, 1.0, 0.1)
        )
    assert any("recomputed" in n and "TTFT ≤ 10 ms" in n for n in inputs.notes)


# --- what the latencies cover ------------------------------------------------------------------------------


def runs_dir(root: Path, scenario_text: str) -> Path:
    """reports/mini/ with real runs of both policies of `scenario_text` (no sweep)."""
    scenario_file = root / "mini.toml"
    scenario_file.write_text(scenario_text)
    report_dir = root / "reports" / "mini"
    report_dir.mkdir(parents=True)
    sc = load_scenario(scenario_file)
    for policy in sc.policies:
        write_result(run_policy(sc, policy, root), report_dir)
    return report_dir


def covered(report_dir: Path) -> dict[str, str]:
    """Per policy, what its latencies cover, as the page must say it: `static 33 of 611 requests (...)`."""
    out = {}
    for run in load_inputs(report_dir).runs:
        req = run.summary["requests"]
        rest = req["arrived"] - req["finished"]
        tail = f"{rest:,} unfinished" if rest else "all finished"
        out[run.policy] = f"{run.policy} {req['finished']:,} of {req['arrived']:,} requests ({tail})"
    return out


def page_text(report_dir: Path) -> str:
    """The page's <main>, unescaped."""
    html = (report_dir / "index.html").read_text()
    return unescape(html[html.index("<main>") : html.index("</main>")])


def test_an_overloaded_runs_headline_says_so_before_any_latency_and_what_they_cover(tmp_path: Path) -> None:
    """At 30 req/s both policies pile up requests and most never finish. The headline used to open with
    'static keeps p99 TTFT at 9 s against 15 s' over the few survivors, without saying so: it now says
    first that the runs are overloaded, and each latency sentence and table says how many requests it
    covers."""
    text = SCENARIO.replace("rate = 3.0", "rate = 30.0").replace("duration_s = 40", "duration_s = 10")
    report_dir = runs_dir(tmp_path, text)
    assert all(r.summary["overloaded"] for r in load_inputs(report_dir).runs)
    build_report(report_dir, png=False)
    main = page_text(report_dir)
    leads = re.findall(r'<p class="lead">(.*?)</p>', main)
    cover = covered(report_dir)
    assert all("unfinished" in c for c in cover.values())
    assert leads[0].startswith("Overloaded at 30 req/s: continuous and static pile up requests faster")
    assert all(c in leads[0] for c in cover.values()), leads[0]
    after_meta = main[main.index('<p class="meta">') :]
    after_meta = after_meta[after_meta.index("</p>") :]  # the meta line states the SLO, not a latency
    first_latency = min(after_meta.index(word) for word in ("TTFT", "TPOT", "E2E", " ms", " s "))
    assert after_meta.index("Overloaded at 30 req/s") < first_latency
    assert "over the requests that finished: " in leads[1] and all(c in leads[1] for c in cover.values())
    note = re.search(r'</table><p class="coverage">(.*?)</p>', main)
    assert note is not None and note[1].startswith("TTFT, TPOT and E2E cover only the requests that finished")
    assert all(c in note[1] for c in cover.values())


def test_a_normal_runs_page_says_what_its_latencies_cover(tmp_path: Path) -> None:
    """A run that keeps up and drains says no overload, and still states that its latencies cover every
    request, beside the headline, the table and the latency distributions."""
    text = SCENARIO.replace("rate = 3.0", "rate = 0.8")  # static batching's 8 keep up (at 1.0 they do not)
    text = text.replace("duration_s = 40", "duration_s = 20\ndrain = true")
    report_dir = runs_dir(tmp_path, text)
    assert not any(r.summary["overloaded"] for r in load_inputs(report_dir).runs)
    build_report(report_dir, png=False)
    main = page_text(report_dir)
    cover = covered(report_dir)
    assert all(c.endswith("(all finished)") for c in cover.values())
    leads = re.findall(r'<p class="lead">(.*?)</p>', main)
    assert "Overloaded" not in main and leads[0].startswith("At 0.8 req/s, ")
    assert all(c in leads[0] for c in cover.values()), leads[0]
    note = re.search(r'</table><p class="coverage">(.*?)</p>', main)
    assert note is not None and all(c in note[1] for c in cover.values())
    cdf = main[main.index('<section id="latency_cdf">') :]
    cdf = cdf[: cdf.index("</section>")]
    assert "The curves cover only the requests that finished" in cdf and all(c in cdf for c in cover.values())


def test_a_sweep_page_says_what_its_latencies_cover() -> None:
    """The latency-against-rate chart is made of each point's latencies over its finished requests: its
    note adds up how many of the sweep's requests that is, and how many runs were overloaded."""
    points = pl.DataFrame(
        [point_row(p, r, rep) for p in HELD for r in RATES for rep in range(2)], schema=POINT_SCHEMA
    )
    arrived, finished = int(points["arrived"].sum()), int(points["finished"].sum())
    over = int(points["overloaded"].sum())
    assert 0 < over < points.height and finished < arrived
    (latency, *_) = sweep_sections(load_inputs_of(points), [], [])
    assert latency.key == "latency_vs_rate"
    assert (
        f"Latencies cover only the requests that finished: over the sweep's {points.height} runs, "
        f"{finished:,} of {arrived:,} requests ({arrived - finished:,} unfinished); {over} of the "
        f"{points.height} runs overloaded."
    ) in latency.note


def load_inputs_of(points: pl.DataFrame) -> ReportInputs:
    return ReportInputs(name="mini", points=points)


def test_each_latency_says_what_it_covers_in_words() -> None:
    """The phrases the pages and tables use: a queue wait covers the requests ever scheduled, a TPOT the
    finished ones with more than one token; one overloaded run of two is named alone."""
    from sim.report.coverage import count_text, metric_text, overload_sentence

    assert count_text(784, 1738) == "784 of 1,738 requests (954 unfinished)"
    assert count_text(120, 120) == "120 of 120 requests (all finished)"
    assert metric_text("queue_wait", 590, 33, 611) == "590 of 611 requests (21 never scheduled)"
    assert metric_text("tpot", 31, 33, 611, "") == "31 of 611 (578 unfinished, 2 of one token)"
    assert metric_text("tpot", 31, 33, 33) == "31 of 33 requests (2 of one token)"
    summary = {"overloaded": True, "requests": {"arrived": 611, "finished": 33}}
    calm = {"overloaded": False, "requests": {"arrived": 100, "finished": 100}}
    line = overload_sentence([("static", summary), ("continuous", calm)], 30.0)
    assert line == (
        "Overloaded at 30 req/s: static piles up requests faster than it finishes them, so the latencies "
        "below cover only the requests that finished: static 33 of 611 requests (578 unfinished)."
    )
    assert overload_sentence([("continuous", calm)], 30.0) is None

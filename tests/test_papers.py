"""`sim papers`: each cell judged against the paper's value or range, and the vLLM paper's comparison in its
reduced (CI) form."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.papers import Cell, load_paper
from sim.io.errors import SimError
from sim.report.papers_page import curve_frames, write_papers_page
from sim.studies.papers import judge, quick_overrides, run_comparison, unexpected

PAPERS = Path(__file__).parent.parent / "scenarios" / "papers"


SCHEMA = {
    "policy": pl.String, "rate": pl.Float64, "mean_batch_size": pl.Float64, "e2e_p50": pl.Float64,
    "slo_attainment": pl.Float64,
}  # fmt: skip


def fake_sweep(
    caps: dict[str, float | None],
    batches: dict[str, float] | None = None,
    e2e: dict[str, float] | None = None,
) -> Any:
    rows = [  # each policy's attainment is its batch over 10
        {"policy": p, "rate": 2.0, "mean_batch_size": b, "e2e_p50": (e2e or {}).get(p),
         "slo_attainment": b / 10}
        for p, b in (batches or {}).items()
    ]  # fmt: skip
    return SimpleNamespace(
        capacity={"capacities": [{"policy": p, "params": {}, "capacity": c} for p, c in caps.items()]},
        points=pl.DataFrame(rows, schema=SCHEMA),
    )


def cell(**fields: Any) -> Cell:
    return Cell.model_validate({"name": "c", "source": "s", **fields})


def test_a_ratio_passes_inside_the_range_widened_by_its_tolerance() -> None:
    ratio = cell(figure="capacity_ratio", policies=["a", "b"], low=1.7, high=2.7)
    inside = judge(ratio, fake_sweep({"a": 2.0, "b": 1.0}))
    assert inside.passed and inside.ratio == 1.0
    edge = judge(ratio, fake_sweep({"a": 3.3, "b": 1.0}))  # 3.3 ≤ 2.7 × 1.25
    assert edge.passed and edge.ratio == pytest.approx(3.3 / 2.7)
    assert not judge(ratio, fake_sweep({"a": 3.5, "b": 1.0})).passed
    assert not judge(ratio, fake_sweep({"a": 1.2, "b": 1.0})).passed  # below 1.7 × 0.75
    assert judge(ratio, fake_sweep({"a": 1.2, "b": 1.0}), widen=2.0).passed  # the quick form's ±50%
    assert not judge(ratio, fake_sweep({"a": None, "b": 1.0})).passed


def test_an_order_needs_strictly_rising_capacities() -> None:
    order = cell(figure="capacity_order", policies=["a", "b", "c"])
    assert judge(order, fake_sweep({"a": 1.0, "b": 2.0, "c": 3.0})).passed
    assert not judge(order, fake_sweep({"a": 1.0, "b": 3.0, "c": 2.0})).passed


def test_a_batch_figure_is_read_at_its_rate() -> None:
    batch = cell(figure="batch_size", policies=["a"], rate=2.0, low=10.0)
    assert judge(batch, fake_sweep({"a": 1.0}, {"a": 11.0})).passed
    with pytest.raises(SimError, match="no sweep point for policy 'a' at rate 3"):
        judge(batch.model_copy(update={"rate": 3.0}), fake_sweep({"a": 1.0}, {"a": 11.0}))


def test_a_speedup_is_the_baseline_latency_over_the_faster_ones_at_its_rate() -> None:
    speedup = cell(figure="speedup", policies=["base", "fast"], rate=2.0, low=1.5)
    sweep = fake_sweep({}, {"base": 1.0, "fast": 1.0}, {"base": 3.0, "fast": 2.0})
    verdict = judge(speedup, sweep)
    assert verdict.passed and verdict.value == pytest.approx(1.5)
    slower = judge(speedup.model_copy(update={"policies": ["fast", "base"]}), sweep)  # 0.67 < 1.5 × 0.75
    assert not slower.passed and slower.value == pytest.approx(2 / 3)
    with pytest.raises(SimError, match="the sweep has no policy 'other'"):
        judge(speedup.model_copy(update={"policies": ["base", "other"]}), sweep)


def test_an_attainment_is_one_policys_share_within_the_slo_at_its_rate() -> None:
    attainment = cell(figure="attainment", policies=["a"], rate=2.0, low=0.6, high=0.9)
    assert judge(attainment, fake_sweep({}, {"a": 9.5})).passed  # 0.95 ≤ 0.9 × 1.25
    low = judge(attainment, fake_sweep({}, {"a": 4.0}))  # 0.4 < 0.6 × 0.75
    assert not low.passed and low.value == pytest.approx(0.4) and low.ratio == pytest.approx(0.4 / 0.6)
    with pytest.raises(ValueError, match="policies: attainment takes 1"):
        cell(figure="attainment", policies=["a", "b"], rate=2.0, low=0.6)


def test_the_quick_form_shortens_only_longer_horizons(tmp_path: Path) -> None:
    longer, shorter = tmp_path / "long.toml", tmp_path / "short.toml"
    longer.write_text("[horizon]\nduration_s = 600\n")
    shorter.write_text("[horizon]\nduration_s = 100\n")
    assert "horizon.duration_s=120" in quick_overrides(longer)
    assert not any(o.startswith("horizon.") for o in quick_overrides(shorter))


def test_a_speedup_needs_a_rate_and_a_known_metric() -> None:
    with pytest.raises(ValueError, match="rate: speedup is read at one sweep rate"):
        cell(figure="speedup", policies=["a", "b"], low=1.5)
    with pytest.raises(ValueError, match="metric"):
        cell(figure="speedup", policies=["a", "b"], low=1.5, rate=1.0, metric="latency")


def test_bad_paper_files_say_where(tmp_path: Path) -> None:
    path = tmp_path / "x.paper.toml"
    path.write_text('scenario = "s.toml"\npaper = "p"\n[[cells]]\nname = "n"\nfigure = "batch_size"\n'
                    'policies = ["a"]\nsource = "s"\nlow = 1.0\n')  # fmt: skip
    with pytest.raises(SimError, match=r"x.paper.toml: .*rate: batch_size is read at one sweep rate"):
        load_paper(path)


def test_vllm_paper_fig12_reduced_form(tmp_path: Path) -> None:
    """The reduced form CI runs: every cell matches or is a stated gap, and the ordering holds."""
    comparison = run_comparison(PAPERS / "vllm-fig12.paper.toml", tmp_path / "vllm-fig12", 1, True, None)
    verdicts = {v.cell.name: v for v in comparison.verdicts}
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    assert verdicts["capacity order"].passed
    assert verdicts["vLLM / Orca (Oracle), capacity"].passed
    # On the 2023 engine's step costs (engine "vllm-2023") vLLM is at its knee at 2 req/s, as in Fig. 13a.
    assert verdicts["vLLM batch at 2 req/s"].passed, verdicts["vLLM batch at 2 req/s"].shown
    assert (tmp_path / "vllm-fig12" / "sweep" / "capacity.json").exists()


def test_sim_papers_cli_refuses_a_folder_without_comparisons(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["papers", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no *.paper.toml files" in result.output


@pytest.mark.parametrize("name", ["vllm-spec-sharegpt", "vllm-spec-cnn"])
def test_vllm_speculative_blog_reduced_form(tmp_path: Path, name: str) -> None:
    """The blog's speed-ups at 1 req/s: no capacity cell, so no capacity search is run."""
    comparison = run_comparison(PAPERS / f"{name}.paper.toml", tmp_path / name, 1, True, None)
    assert comparison.sweep.capacity is None
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    (verdict,) = comparison.verdicts
    assert verdict.value is not None and verdict.value > 1.2


def test_the_report_page_overlays_the_simulated_curve_on_the_published_point(tmp_path: Path) -> None:
    comparison = run_comparison(PAPERS / "vllm-spec-sharegpt.paper.toml", tmp_path / "spec", 1, True, None)
    curve, published = curve_frames(comparison, "speedup")
    assert curve["rate"].to_list() == [1.0, 4.0, 8.0]
    assert curve["series"].unique().to_list() == ["draft over vllm"]
    assert published.to_dicts() == [
        {"series": "draft over vllm", "rate": 1.0, "value": 1.5, "cell": comparison.verdicts[0].cell.name}
    ]
    assert curve.filter(pl.col("rate") == 1.0)["value"].item() == pytest.approx(comparison.verdicts[0].value)
    page = write_papers_page([comparison], tmp_path, quick=True, png=False).read_text()
    assert 'data-chart="c0-cells"' in page and 'data-chart="c0-speedup"' in page
    assert "1 of 1 cells match the published figures." in page


@pytest.mark.parametrize("name", ["distserve-vllm", "distserve-disagg"])
def test_distserve_measured_runs_reduced_form(tmp_path: Path, name: str) -> None:
    """The authors' measured attainments: DistServe's cells match; vLLM's at 2 and 3 req/s are stated gaps."""
    comparison = run_comparison(PAPERS / f"{name}.paper.toml", tmp_path / name, 1, True, None)
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    if name == "distserve-vllm":  # on the step costs its authors published (engine "vllm-2023"): within 25%
        (first,) = [v for v in comparison.verdicts if v.cell.rate == 1.0]
        assert first.value == pytest.approx(0.68, rel=0.25)
    if name == "distserve-disagg":
        assert all(v.passed for v in comparison.verdicts)
        values = [v.value for v in comparison.verdicts]  # attainment falls as the rate grows
        assert values == sorted(values, reverse=True) and values[-1] < 0.95  # type: ignore[type-var]


def test_sarathi_serve_mistral_strict_reduced_form(tmp_path: Path) -> None:
    """Sarathi-Serve's capacity is above vLLM's under the paper's rule (P99 TBT and median delay)."""
    name = "sarathi-mistral7b-strict"
    comparison = run_comparison(PAPERS / f"{name}.paper.toml", tmp_path / name, 1, True, None)
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    verdicts = {v.cell.name: v for v in comparison.verdicts}
    assert verdicts["capacity order"].passed
    assert comparison.sweep.capacity is not None
    assert "p99 itl ≤ 0.1 s" in comparison.sweep.capacity["criterion"]


SARATHI_BOUNDS = {
    "sarathi-mistral7b-relaxed": "0.5",
    "sarathi-yi34b-strict": "0.2",
    "sarathi-yi34b-relaxed": "1",
}


@pytest.mark.parametrize("name", sorted(SARATHI_BOUNDS))
def test_sarathi_serve_capacity_table_reduced_form(tmp_path: Path, name: str) -> None:
    """The rest of Sarathi-Serve's capacity table: Sarathi-Serve's capacity is above vLLM's under each SLO,
    and the Yi-34B gains (stated in the text) are within the quick form's tolerance."""
    comparison = run_comparison(PAPERS / f"{name}.paper.toml", tmp_path / name, 1, True, None)
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    verdicts = {v.cell.name: v for v in comparison.verdicts}
    assert verdicts["capacity order"].passed
    assert comparison.sweep.capacity is not None
    assert f"p99 itl ≤ {SARATHI_BOUNDS[name]} s" in comparison.sweep.capacity["criterion"]


def test_a_throughput_is_read_at_its_rate_and_sweep_point() -> None:
    """A throughput cell reads one policy's finished requests per second at the sweep point its `params`
    name; a throughput_ratio divides it by the second policy's at `base_params`."""
    points = pl.DataFrame({
        "policy": ["a", "a", "a"], "rate": [10.0, 10.0, 10.0], "requests_per_s": [8.0, 7.6, 9.9],
        "params": ['{"workload.lora.adapters":5}', '{"workload.lora.adapters":2000}', None],
    })  # fmt: skip
    sweep: Any = SimpleNamespace(capacity=None, points=points)
    at = {"workload.lora.adapters": 2000}
    one = judge(cell(figure="throughput", policies=["a"], rate=10.0, params=at, low=7.6), sweep)
    assert one.passed and one.value == pytest.approx(7.6)
    trend = cell(figure="throughput_ratio", policies=["a", "a"], rate=10.0, params=at,
                 base_params={"workload.lora.adapters": 5}, low=0.95)  # fmt: skip
    assert judge(trend, sweep).value == pytest.approx(7.6 / 8.0)
    with pytest.raises(SimError, match="workload.lora.adapters = 100"):
        judge(cell(figure="throughput", policies=["a"], rate=10.0, low=7.6,
                   params={"workload.lora.adapters": 100}), sweep)  # fmt: skip
    with pytest.raises(ValueError, match="base_params: only a throughput_ratio"):
        cell(figure="throughput", policies=["a"], rate=10.0, low=7.6, base_params=at)


def test_slora_throughput_against_adapters_reduced_form(tmp_path: Path) -> None:
    """S-LoRA's measured throughput with 5 to 2,000 adapters at 10 req/s: the S-LoRA policy keeps it nearly
    flat (the trend cell), and the 1,000 and 2,000 cells are stated gaps of engine speed."""
    comparison = run_comparison(PAPERS / "slora-s1.paper.toml", tmp_path / "slora-s1", 1, True, None)
    assert comparison.sweep.capacity is None
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    verdicts = {v.cell.name: v for v in comparison.verdicts}
    assert verdicts["S-LoRA throughput, 2,000 over 5 adapters"].passed
    assert verdicts["S-LoRA throughput, 5 adapters"].value == pytest.approx(8.046, rel=0.25)

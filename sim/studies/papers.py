"""`sim papers`: run each published comparison in `scenarios/papers/` and judge its cells (docs/papers.md).

Each `NAME.paper.toml` names a scenario beside it; that scenario's sweep runs (with `--find-capacity` under
its own `[sweep.capacity]` rule when a cell reads capacities), and every cell is read from the sweep:
capacities (their order or a ratio), and at one rate mean batch sizes, speed-ups (one policy's latency
statistic over another's), SLO attainments and throughputs (finished requests per second at a fixed offered
rate, or a ratio of two, at sweep points chosen by their `sweep.params`), each the mean over replications.
Step-cost cells read the step times a policy pays (sim/studies/paper_steps.py); a comparison of those alone
runs no sweep. A cell passes when the simulated value lies within `tolerance` of the paper's value (or
range): `low·(1 − tol) ≤ value ≤ high·(1 + tol)`. `quick` is the reduced form CI runs: a shorter horizon,
fewer bisection rounds, and every tolerance doubled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.console import Console

from sim.config.papers import STEP_FIGURES, Cell, PaperFile, load_paper
from sim.config.scenario import read_toml
from sim.io.errors import SimError
from sim.studies.paper_steps import step_values
from sim.studies.sweep import SweepResult, run_sweep

QUICK_DURATION_S = 120.0  # the quick form's horizon, for scenarios that run longer
QUICK = ("sweep.capacity_steps=2",)


@dataclass(frozen=True, slots=True)
class Verdict:
    cell: Cell
    value: float | None  # the simulator's figure (capacity_order: None)
    shown: str  # the simulator's figure as printed
    ratio: float | None  # value over the paper's nearest bound (1 inside the range)
    tolerance: float
    passed: bool

    @property
    def status(self) -> str:
        if self.passed:
            return "matches"
        return "known gap" if self.cell.known_gap else "DIFFERS"


@dataclass(frozen=True, slots=True)
class Comparison:
    path: Path
    paper: PaperFile
    sweep: SweepResult | None  # None: step-cost cells alone, nothing swept
    verdicts: list[Verdict]


def paper_text(cell: Cell) -> str:
    if cell.figure == "capacity_order":
        return " < ".join(cell.policies)
    assert cell.low is not None
    high = cell.high if cell.high is not None else cell.low
    return f"{cell.low:g}" if high == cell.low else f"{cell.low:g}–{high:g}"


def _capacities(sweep: SweepResult) -> dict[str, float | None]:
    assert sweep.capacity is not None
    return {c["policy"]: c["capacity"] for c in sweep.capacity["capacities"] if not c["params"]}


def point_mean(
    sweep: SweepResult, policy: str, rate: float, column: str, params: dict[str, Any] | None = None
) -> float | None:
    """A sweep column's mean over the replications of one policy at one rate, at the sweep point whose
    `sweep.params` values include `params` (None: no run has it)."""
    rows = sweep.points.filter((pl.col("policy") == policy) & (pl.col("rate") == rate))
    if params:
        keep = [_has_params(p, params) for p in rows["params"].to_list()]
        rows = rows.filter(pl.Series(keep, dtype=pl.Boolean))
    if rows.height == 0:
        at = "".join(f", {k} = {v!r}" for k, v in (params or {}).items())
        raise SimError(
            f"no sweep point for policy {policy!r} at rate {rate:g}{at}: add it to sweep.rates (or .params)"
        )
    values = [v for v in rows[column].to_list() if v is not None]
    return float(np.mean(values)) if values else None


def _has_params(point: str | None, params: dict[str, Any]) -> bool:
    values = json.loads(point) if point else {}
    return all(k in values and values[k] == v for k, v in params.items())


def rate_column(cell: Cell) -> str:
    """The sweep column a figure read at one rate comes from."""
    if cell.figure.startswith("batch"):
        return "mean_batch_size"
    if cell.figure.startswith("throughput"):
        return "requests_per_s"
    return "slo_attainment" if cell.figure == "attainment" else f"{cell.metric}_{cell.stat}"


def _rate_value(cell: Cell, sweep: SweepResult) -> float | None:
    assert cell.rate is not None
    points = [cell.params, cell.params if cell.base_params is None else cell.base_params]
    column = rate_column(cell)
    pairs = zip(cell.policies, points, strict=False)
    figures = [point_mean(sweep, p, cell.rate, column, at) for p, at in pairs]
    if None in figures:
        return None
    if len(figures) == 1:  # batch_size, attainment
        return figures[0]
    # batch_ratio: the first's batch over the second's; speedup: baseline over faster; throughput_ratio: the
    # first's finished requests per second over the second's (at `base_params`)
    num, den = figures
    return None if not den else num / den  # type: ignore[operator]


def judge(cell: Cell, sweep: SweepResult, widen: float = 1.0) -> Verdict:
    """One cell's verdict from a finished sweep; `widen` scales its tolerance (the quick form's 2)."""
    tol = cell.tolerance * widen
    swept = set(sweep.points["policy"].to_list()) if sweep.points.height else set()
    caps = _capacities(sweep) if cell.figure.startswith("capacity") else {}
    for name in cell.policies:
        if name not in (caps or swept):
            raise SimError(f"cell {cell.name!r}: the sweep has no policy {name!r}")
    if cell.figure == "capacity_order":
        values = [caps[p] for p in cell.policies]
        ok = None not in values and all(a < b for a, b in zip(values, values[1:], strict=False))  # type: ignore[operator]
        shown = " < ".join("?" if v is None else f"{v:.3g}" for v in values)
        return Verdict(cell, None, shown, None, tol, ok)
    if cell.figure.startswith("capacity"):
        num, den = caps[cell.policies[0]], caps[cell.policies[1]]
        value = None if num is None or den is None or den == 0 else num / den
    else:
        value = _rate_value(cell, sweep)
    if value is None:
        missing = "no capacity found" if cell.figure.startswith("capacity") else "no finished requests"
        return Verdict(cell, None, missing, None, tol, False)
    return judge_value(cell, value, widen)


def judge_value(cell: Cell, value: float, widen: float = 1.0) -> Verdict:
    """A figure's verdict against the paper's value or range, its tolerance scaled by `widen`."""
    tol = cell.tolerance * widen
    assert cell.low is not None
    low, high = cell.low, cell.high if cell.high is not None else cell.low
    ratio = value / low if value < low else value / high if value > high else 1.0
    ok = low * (1 - tol) <= value <= high * (1 + tol)
    return Verdict(cell, value, f"{value:.3g}", ratio, tol, ok)


def quick_overrides(scenario: Path) -> tuple[str, ...]:
    """The reduced form's `--set`s: fewer bisection rounds, and a horizon cut to 120 s where it is longer."""
    duration = read_toml(scenario).get("horizon", {}).get("duration_s")
    shorter = () if isinstance(duration, int | float) and duration <= QUICK_DURATION_S else (
        f"horizon.duration_s={QUICK_DURATION_S:g}",
    )  # fmt: skip
    return QUICK + shorter


def run_comparison(path: Path, out: Path, jobs: int, quick: bool, console: Console | None) -> Comparison:
    paper = load_paper(path)
    scenario = path.parent / paper.scenario
    overrides = quick_overrides(scenario) if quick else ()
    sweep = None
    if paper.needs_sweep():
        sweep = run_sweep(
            scenario, overrides, jobs, force=True, find_capacity=paper.needs_capacity(), out=out,
            console=console,
        )  # fmt: skip
    widen = 2.0 if quick else 1.0
    stepped = [c for c in paper.cells if c.figure in STEP_FIGURES]
    step_figures = iter(step_values(stepped, scenario) if stepped else [])
    verdicts = []
    for cell in paper.cells:
        if cell.figure in STEP_FIGURES:
            verdicts.append(judge_value(cell, next(step_figures), widen))
        else:
            assert sweep is not None  # a cell outside STEP_FIGURES makes the comparison sweep
            verdicts.append(judge(cell, sweep, widen))
    return Comparison(path, paper, sweep, verdicts)


def paper_files(folder: Path, only: list[str] | None = None) -> list[Path]:
    """The comparisons of `folder`, or those named in `only` (NAME of NAME.paper.toml)."""
    if not folder.is_dir():
        raise SimError(f"{folder}: no such folder of paper comparisons")
    found = sorted(folder.glob("*.paper.toml"))
    if not found:
        raise SimError(f"{folder}: no *.paper.toml files")
    if only:
        names = {p.name.removesuffix(".paper.toml"): p for p in found}
        unknown = [n for n in only if n not in names]
        if unknown:
            known = ", ".join(names)
            raise SimError(f"--only: no comparison {unknown[0][:60]!r} in {folder} (one of {known})")
        found = [names[n] for n in dict.fromkeys(only)]
    return found


def run_papers(
    folder: Path, out: Path, jobs: int = 2, quick: bool = False, console: Console | None = None,
    only: list[str] | None = None,
) -> list[Comparison]:  # fmt: skip
    """Every comparison in `folder` (or those `only` names), each swept into `out/<name>/`."""
    return [
        run_comparison(p, out / p.name.removesuffix(".paper.toml"), jobs, quick, console)
        for p in paper_files(folder, only)
    ]


def unexpected(comparisons: list[Comparison]) -> list[Verdict]:
    """Cells that miss without a stated reason: what fails `sim papers`."""
    return [v for c in comparisons for v in c.verdicts if not v.passed and not v.cell.known_gap]


def as_rows(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    return [
        {
            "comparison": c.path.name, "cell": v.cell.name, "paper": paper_text(v.cell), "sim": v.shown,
            "ratio": v.ratio, "tolerance": v.tolerance, "status": v.status, "source": v.cell.source,
        }
        for c in comparisons
        for v in c.verdicts
    ]  # fmt: skip

"""Terminal output of `sim run` and `sim sweep`: the table comparing the policies, what a sweep ran, notes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import typer
from rich.console import Console
from rich.table import Table

from sim.catalog.generation import generation_note
from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import transfer_note
from sim.config.scenario import Scenario
from sim.engine.sampling import SAMPLED_SCHEDULERS
from sim.io.errors import SimError
from sim.io.progress import Stopwatch
from sim.report.coverage import count_text, metric_text, points_text
from sim.report.inputs import describe_differences
from sim.studies.folder import SWEEP_DIR, other_scenario_runs, read_sweep_scenario, sweep_differences

if TYPE_CHECKING:  # the sweep's machinery (executors, statistics) is not loaded for `sim run`
    from sim.studies.sweep import SweepResult


def run_line(summary: dict[str, Any], watch: Stopwatch) -> str:
    """One line after a policy's run: what was simulated and how long it took."""
    req = summary["requests"]
    horizon = summary.get("horizon_s")
    span = f" over {horizon:,.0f} s simulated" if isinstance(horizon, int | float) else ""
    return f"{summary['policy']}: {req['arrived']:,} requests{span} in {watch}"


def rejection_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """One line per (policy, reject reason): how many requests were rejected, and why."""
    width = max((len(s["policy"]) for s in summaries), default=0)
    return [
        f"  {s['policy']:<{width}}  {count:>7,}  {reason}"
        for s in summaries
        for reason, count in sorted(s.get("rejected_reasons", {}).items())
        if count
    ]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:,.1f}"


def coverage_rows(summaries: list[dict[str, Any]], counts: list[dict[str, int]] | None) -> list[list[str]]:
    """Rows `[label, cell per run]` saying how many requests each latency covers: one row per run of the
    metrics (in `LATENCY_ROWS` order) that cover the same requests in every run. Without `counts`
    (`latency_counts` per run), TTFT, TPOT, ITL and E2E are said to cover the finished requests."""
    cells = []
    for i, s in enumerate(summaries):
        req = s["requests"]
        covered = counts[i] if counts is not None else {m: req["finished"] for m in LATENCY_ROWS}
        cells.append(
            {
                m: metric_text(m, covered[m], req["finished"], req["arrived"], "") if m in covered else "—"
                for m in LATENCY_ROWS
            }
        )
    rows: list[tuple[list[str], list[str]]] = []
    for metric in LATENCY_ROWS:
        if counts is None and metric == "queue_wait":
            continue
        texts = [c[metric] for c in cells]
        if rows and rows[-1][1] == texts:
            rows[-1][0].append(metric)
        else:
            rows.append(([metric], texts))
    return [[f"{', '.join(names)} cover{'s' if len(names) == 1 else ''}", *texts] for names, texts in rows]


LATENCY_ROWS = ("queue_wait", "ttft", "tpot", "itl", "e2e")


def print_comparison(
    scenario: Scenario,
    summaries: list[dict[str, Any]],
    out_dir: Path,
    counts: list[dict[str, int]] | None = None,
) -> None:
    """The table comparing the runs; `counts` (`latency_counts` of each run's records) say how many requests
    each latency covers."""
    console = Console()
    title = f"{scenario.name}: {scenario.model.name} on {scenario.model.gpu} (TP {scenario.model.tp})"
    table = Table(title=title)
    table.add_column("metric")
    for s in summaries:
        table.add_column(s["policy"], justify="right")

    def row(label: str, fn: Any) -> None:
        table.add_row(label, *[fn(s) for s in summaries])

    row("finished / arrived", lambda s: f"{s['requests']['finished']:,} / {s['requests']['arrived']:,}")
    row("rejected", lambda s: f"{s['requests']['rejected']:,}")
    row("in flight at horizon", lambda s: f"{s['requests']['in_flight']:,}")
    row("overloaded", lambda s: "YES" if s["overloaded"] else "no")
    row("throughput (req/s)", lambda s: f"{s['throughput']['requests_per_s']:.2f}")
    row("output tokens/s", lambda s: f"{s['throughput']['output_tokens_per_s']:,.0f}")
    for cover in coverage_rows(summaries, counts):
        table.add_row(*cover)
    for metric in LATENCY_ROWS:
        for q in ("p50", "p99"):
            row(f"{metric} {q} (ms)", lambda s, m=metric, q=q: _ms(s["latency"][m][q]))
    row("goodput (req/s)", lambda s: f"{s['goodput_per_s']:.2f}")
    row("mean batch size", lambda s: f"{s['steps']['mean_batch_size']:.1f}")
    row("max batch size", lambda s: f"{s['steps']['max_batch_size']:,}")
    row(
        "KV: states / held unused / free",
        lambda s: " / ".join(f"{s['kv_memory'][k]:.0%}" for k in ("token_states", "held_unused", "free")),
    )
    row("preemptions", lambda s: f"{s['steps']['preemptions']:,}")
    row("prefix-cache hit rate", lambda s: f"{s['prefix_cache_hit_rate']:.0%}")
    console.print(table)
    note = transfer_note(get_gpu(scenario.model.gpu))
    if note:
        console.print(note, highlight=False)
    sampled = any(s.get("scheduler") in SAMPLED_SCHEDULERS for s in summaries)
    if sampled and (defaults := generation_note(scenario.model.name)):
        console.print(defaults, highlight=False, markup=False)
    rejected = rejection_lines(summaries)
    if rejected:
        console.print("rejected requests, by reason:", highlight=False)
        for line in rejected:
            console.print(line, markup=False, highlight=False)
    console.print(f"records and summaries in {out_dir}/<policy>/")


def print_sweep(result: SweepResult, console: Console | None = None) -> None:
    """What ran, where it is, and the capacities found."""
    console = console or Console()
    console.print(
        f"{result.scenario.name}: {result.points.height} points "
        f"({result.ran} run, {result.resumed} already done) in {result.sweep_dir}/"
    )
    covered = points_text(result.points)
    if covered:
        console.print(covered, highlight=False)
    if result.capacity is None:
        return
    table = Table(title=f"capacity under the SLO ({result.capacity['unit']})")
    table.add_column("policy")
    table.add_column("params")
    table.add_column("capacity", justify="right")
    table.add_column("latencies at capacity cover", justify="right")
    for cap in result.capacity["capacities"]:
        table.add_row(
            cap["policy"],
            json.dumps(cap["params"]) if cap["params"] else "",
            cap["label"],
            _capacity_coverage(result.points, cap),
        )
    console.print(table)


def _capacity_coverage(points: pl.DataFrame, cap: dict[str, Any]) -> str:
    """The requests the latencies at a capacity cover, added over its replications (— without one)."""
    rate = cap.get("capacity")
    if rate is None or points.is_empty():
        return "—"
    params = [json.loads(p) if p else {} for p in points["params"]]
    mask = [
        policy == cap["policy"] and r == rate and p == cap["params"]
        for policy, r, p in zip(points["policy"], points["rate"], params, strict=True)
    ]
    at = points.filter(pl.Series(mask, dtype=pl.Boolean))
    if at.is_empty():
        return "—"
    return count_text(int(at["finished"].sum()), int(at["arrived"].sum()), "")


def note_mixed_runs(out_dir: Path, manifest: dict[str, Any], scenario: Scenario) -> None:
    """Say when `out_dir` also holds runs of another scenario, which `sim report` will not compare, or a
    sweep of another scenario, which it will show with a caveat (the comparisons `sim report` makes)."""
    others = other_scenario_runs(out_dir, manifest)
    try:
        sweep = read_sweep_scenario(out_dir)
    except SimError as err:
        typer.echo(f"note: {err}; `sim report {out_dir}` will refuse it")
        sweep = None
    diff = sweep_differences(sweep, scenario) if sweep is not None else []
    if diff:
        typer.echo(
            f"note: the sweep in {out_dir / SWEEP_DIR} comes from a different scenario than these runs "
            f"({describe_differences(diff, 'the sweep', 'the runs')}); `sim report {out_dir}` will show "
            "its figures beside them with that caveat"
        )
    if not others:
        return
    typer.echo(f"note: {out_dir} also holds runs of a different scenario; `sim report {out_dir}` will refuse")
    typer.echo("  to compare them. Re-run every policy with the same settings, or give another --out:")
    for folder, diff in others.items():
        shown = "; ".join(f"{key}: {theirs!r} there, {ours!r} here" for key, theirs, ours in diff[:4])
        more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
        typer.echo(f"  {folder}: {shown}{more}")

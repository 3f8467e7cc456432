"""The `sim plan` page: the ranked configurations and the cost-latency Pareto front (offline HTML)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import transfer_note
from sim.io.outputs import atomic_write
from sim.report.coverage import count_text
from sim.report.page import Section, chart_spec, render_page
from sim.report.plan_deploy import launch_plan
from sim.report.plan_front import comparison, comparison_sentences, throughput_section
from sim.report.plan_rates import sustained_block, sustained_sentences
from sim.studies.plan_placements import PLACEMENT_COLUMNS
from sim.studies.plan_result import PlanResult, pareto
from sim.studies.plan_verdict import CONFIDENCE

SLO_NAMES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
CANDIDATE_KEYS = (
    "config", "cost_per_hour", "gpus", "verdict", "metric", "threshold", "metric_mean", "ci_low", "ci_high",
    "replications", "replications_overloaded", "settled", "seeds", "judged_goodput_per_s", "judged",
    "judged_good", "judged_in_flight_counted", "judged_in_flight_left_out",
)  # fmt: skip


def slo_rule(result: PlanResult) -> str:
    """The SLO and the rule a configuration was judged by, as one sentence."""
    bounds = [(name, result.slo[key]) for key, name in SLO_NAMES if result.slo.get(key) is not None]
    if result.rule == "p99":
        within = ", ".join(f"p99 {name} ≤ {bound:g} s" for name, bound in bounds) or "no bound given"
        test = f"every p99 latency is within its bound: {within}"
    else:
        each = " and ".join(f"{name} ≤ {bound:g} s" for name, bound in bounds)
        test = (
            f"its goodput (requests per second meeting {each}) is at least {result.attainment:.0%} of "
            f"{result.rate:g} req/s"
        )
    return (
        f"Judged by --rule {result.rule}: a configuration meets the SLO when its run at "
        f"{result.rate:g} req/s is not overloaded and {test}. {confidence_rule(result)}"
    )


def confidence_rule(result: PlanResult) -> str:
    """How the verdict is reached across seeds, and which requests each run is judged on."""
    metric = "judged attainment" if result.rule == "goodput" else "largest p99 latency over its bound"
    horizon = "" if result.horizon_s is None else f" Each run's arrivals last {result.horizon_s:g} s"
    tail = (
        f"{horizon} (at least {result.tail_samples} judged requests past the judged quantile per run)."
        if horizon
        else ""
    )
    return (
        f"Each configuration runs {result.replications} seeds (up to {result.max_replications} while too "
        f"close to call); its verdict comes from the {CONFIDENCE:.0%} interval on the mean {metric}: meets, "
        "fails, or too close to call when the interval straddles the threshold. "
        f"{settle_rule(result)} Judged requests: those "
        "arriving after the warm-up (the first quarter of arrivals); one still in flight at the horizon "
        f"counts against a configuration only when its run is overloaded or it already missed a bound.{tail}"
    )


def settle_rule(result: PlanResult) -> str:
    """How a configuration at the boundary is settled (`plan_verdict`'s Escalation)."""
    if result.settle_seeds <= 0:
        return "One still too close to call after its seeds is not an answer."
    seeds = max(result.settle_seeds, result.replications)
    return (
        "One whose seeds disagree on overload, or still too close to call after its seeds, is at the "
        f"boundary: it runs {seeds} seeds of {result.max_horizon_s:g} s, and meets the SLO only when every "
        "one of them does on its own."
    )


def interval_text(row: dict[str, object]) -> str:
    """The verdict's interval, e.g. `0.95 [0.93, 0.97] (3 seeds)`."""
    mean, low, high = row.get("metric_mean"), row.get("ci_low"), row.get("ci_high")
    if mean is None or low is None or high is None:
        return "-"
    n, over = row.get("replications"), row.get("replications_overloaded")
    loaded = f", {over} overloaded" if over else ""
    at = f" of {json.loads(str(row['overrides']))['horizon.duration_s']:g} s" if row.get("settled") else ""
    return f"{mean:.3g} [{low:.3g}, {high:.3g}] ({n} seed{'' if n == 1 else 's'}{at}{loaded})"


def front_chart(rows: pl.DataFrame, front: pl.DataFrame) -> alt.LayerChart:
    """Every simulated configuration (cost vs p99 TTFT; filled: meets the SLO); the front's configurations
    ringed and joined by a step line."""
    data = rows.select(
        "config", "cost_per_hour", "gpus", "ttft_p99", "tpot_p99", "goodput_per_s", "meets_slo"
    )
    points = (
        alt.Chart(alt.Data(values=data.to_dicts()))
        .mark_point(size=70, filled=True)
        .encode(
            x=alt.X("cost_per_hour:Q", title="cost ($/hour)"),
            y=alt.Y("ttft_p99:Q", title="p99 TTFT (s)", scale=alt.Scale(type="log")),
            color=alt.Color("meets_slo:N", title="meets SLO"),
            tooltip=["config:N", "cost_per_hour:Q", "gpus:Q", "ttft_p99:Q", "tpot_p99:Q", "goodput_per_s:Q"],
        )
    )
    on_front = alt.Data(values=front.select("config", "cost_per_hour", "ttft_p99").to_dicts())
    line = (
        alt.Chart(on_front)
        .mark_line(interpolate="step-after", color="#333")
        .encode(x="cost_per_hour:Q", y="ttft_p99:Q")
    )
    rings = (
        alt.Chart(on_front)
        .mark_point(size=260, filled=False, color="#333", strokeWidth=1.5)
        .encode(x="cost_per_hour:Q", y="ttft_p99:Q", tooltip=["config:N"])
    )
    return alt.layer(points, line, rings).properties(width=640, height=320)


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _covered(row: dict[str, Any]) -> str:
    """The requests a configuration's latencies cover: its finished ones."""
    finished, arrived = row.get("finished"), row.get("arrived")
    if isinstance(finished, int) and isinstance(arrived, int):
        return count_text(finished, arrived, "")
    return "-"


def plan_page(result: PlanResult, rows: pl.DataFrame, front: pl.DataFrame, scenario: str) -> str:
    header = (
        "rank",
        "configuration",
        "$/hour",
        "GPUs",
        "p99 TTFT (s)",
        "p99 TPOT (s)",
        "latencies over",
        "goodput (req/s)",
        "verdict",
        "interval",
    )
    table: list[list[str]] = []
    if rows.height:
        for i, r in enumerate(result.ranked(), 1):
            table.append([
                str(i), r["config"], f"{r['cost_per_hour']:.2f}", str(r["gpus"]), _fmt(r["ttft_p99"]),
                _fmt(r["tpot_p99"]), _covered(r), _fmt(r.get("judged_goodput_per_s", r["goodput_per_s"])),
                str(r.get("verdict", "meets" if r["meets_slo"] else "fails")), interval_text(r),
            ])  # fmt: skip
    best = result.best
    headline = [
        f"Cheapest configuration meeting the SLO at {result.rate:g} req/s: {best['config']}, "
        f"${best['cost_per_hour']:.2f}/hour."
        if best
        else f"No configuration met the SLO at {result.rate:g} req/s."
    ]
    deploy = deployment(result)
    if deploy is not None:
        for g in deploy["groups"]:
            placed = f", {g['placement']}" if g.get("placement") else ""
            headline.append(
                f"Launch {g['count']} x {g['name']} ({g['role']}, {g['gpu']} TP {g['tp']}{placed}): "
                f"{g['command']}" + "".join(f" (note: {n})" for n in g["notes"])
            )
        if deploy["routing"]:
            headline.append(deploy["routing"])
    headline += comparison_sentences(comparison(result.rows))
    headline += sustained_sentences(result)
    meta = (
        f"{slo_rule(result)} {scenario}; grid of {result.grid_size} configurations: "
        f"{result.unfit} do not fit the model, "
        f"{result.theory_pruned} ruled out by theory, "
        f"{result.capacity_pruned} by single-replica capacity, "
        f"{result.dominance_pruned} by dominance, {result.simulated} simulated."
    )
    meta = " ".join([meta, *placement_lines(result), *removed_lines(result)])
    sections, specs = [], {}
    on_front = f"{front.height} configuration{'' if front.height == 1 else 's'}"
    note = (
        "Each point is one simulated configuration (coloured by whether it meets the SLO). Ringed: the "
        f"cost-latency Pareto front ({on_front}), the configurations meeting the SLO that no cheaper one "
        "beats on p99 TTFT, joined by a step line when there are two or more (the search stops at the "
        "answer unless --explore runs more)."
    )
    if rows.height:
        chart = front_chart(rows, front)
        sections.append(Section("front", "Cost against p99 TTFT", note, chart))
        specs["front"] = chart_spec(chart)
    else:
        sections.append(Section("front", "Cost against p99 TTFT", note, None, "Nothing was simulated."))
    throughput, spec = throughput_section(result.rows)
    sections.append(throughput)
    if spec is not None:
        specs["throughput"] = spec
    return render_page(
        "sim plan", "Cheapest fleet within the SLO", meta, headline, (header, table), sections, specs
    )


def placement_lines(result: PlanResult) -> list[str]:
    """The placement axes searched, as a sentence (none when the search had none)."""
    a = result.placements
    if not a:
        return []
    ep = ", ".join(str(d) for d in a["ep_dp"]) or "none"
    return [
        f"Placements: PP {', '.join(str(p) for p in a['pp'])}; EP with DP attention at DP {ep}; within "
        f"{a['nodes']} node(s) of {a['gpus_per_node']} GPUs per replica."
    ]


def removed_lines(result: PlanResult) -> list[str]:
    """What each pruning rule removed, by the axis values it removed (`plan_space.tally`)."""
    lines = []
    for rule, counts in sorted(result.removed.items()):
        parts = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if k != "configurations")
        lines.append(f"Removed by {rule}: {counts.get('configurations', 0)} ({parts}).")
    return lines


def transfer_lines(result: PlanResult) -> list[str]:
    """A line for each GPU of the simulated configurations that has no kernel tables of its own."""
    gpus = sorted({str(r["gpu"]) for r in result.rows if r.get("gpu")})
    return [n for n in (transfer_note(get_gpu(g)) for g in gpus) if n]


def deployment(result: PlanResult) -> dict[str, Any] | None:
    """The answer's `vllm serve` command line per group and how requests reach them (`plan_deploy`)."""
    if result.best is None or not result.raw:
        return None
    launches, routing = launch_plan(result.configured(result.best), result.policy)
    return {"groups": [g.as_dict() for g in launches], "routing": routing}


def write_plan(result: PlanResult, scenario_path: Path, out_dir: Path) -> list[Path]:
    """plan.parquet (every simulated configuration), plan.json (the answer and the search's counts) and
    index.html (the ranked table and the cost-latency front)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame(result.rows) if result.rows else pl.DataFrame()
    paths = [out_dir / "plan.parquet", out_dir / "plan.json", out_dir / "index.html"]
    atomic_write(paths[0], lambda p: frame.write_parquet(p))
    best = result.best
    keys = CANDIDATE_KEYS + (PLACEMENT_COLUMNS if result.placements else ())
    info = {
        "scenario": str(scenario_path),
        "rate": result.rate,
        "attainment": result.attainment,
        "rule": result.rule,
        "slo": result.slo,
        "grid_size": result.grid_size,
        "theory_pruned": result.theory_pruned,
        "does_not_fit": result.unfit,
        "capacity_pruned": result.capacity_pruned,
        "single_replica_capacity_req_per_s": result.capacity,
        "dominance_pruned": result.dominance_pruned,
        "format_unsupported": result.removed.get("format_unsupported", {}).get("configurations", 0),
        "pruned_by_rule": result.removed,
        "simulated": result.simulated,
        "brute_force_runs_avoided": result.grid_size - result.simulated,
        "best": None if best is None else {**best, "set": result.reproduce(best)},
        "replications": result.replications,
        "max_replications": result.max_replications,
        "tail_samples": result.tail_samples,
        "max_horizon_s": result.max_horizon_s,
        "settle_seeds": result.settle_seeds,
        "horizon_s": result.horizon_s,
        "confidence": CONFIDENCE,
        "deploy": deployment(result),
        "aggregated_vs_disaggregated": comparison(result.rows),
        "candidates": [{k: r.get(k) for k in keys} for r in result.ranked()],
    }
    if result.placements:
        info["placements"] = result.placements
    if result.rate_steps > 0:
        info["sustained_rates"] = sustained_block(result)
    text = json.dumps(info, indent=2, sort_keys=True, default=float) + "\n"
    atomic_write(paths[1], lambda p: Path(p).write_text(text, encoding="utf-8"))
    html = plan_page(result, frame, pareto(frame) if frame.height else frame, str(scenario_path))
    atomic_write(paths[2], lambda p: Path(p).write_text(html, encoding="utf-8"))
    return paths


def _rate(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.2f}/s"


def print_plan(result: PlanResult, out_dir: Path) -> None:
    """The ranked table (configurations meeting the SLO first, cheapest first) and the answer."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"sim plan at {result.rate:g} req/s")
    columns = ("rank", "configuration", "$/hour", "GPUs", "p99 TTFT", "p99 TPOT", "latencies over", "goodput",
               "verdict", "interval")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for i, r in enumerate(result.ranked(), 1):
        ttft, tpot = r["ttft_p99"], r["tpot_p99"]
        table.add_row(
            str(i), r["config"], f"{r['cost_per_hour']:.2f}", str(r["gpus"]),
            "-" if ttft is None else f"{ttft:.3f} s", "-" if tpot is None else f"{tpot * 1000:.1f} ms",
            _covered(r), _rate(r.get("judged_goodput_per_s", r["goodput_per_s"])), str(r.get("verdict", "-")),
            interval_text(r),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"grid {result.grid_size} configurations: {result.unfit} do not fit the model in memory, "
        f"{result.theory_pruned} ruled out by theory, "
        f"{result.capacity_pruned} by single-replica capacity ({len(result.capacity)} capacity runs), "
        f"{result.dominance_pruned} by dominance, {result.simulated} simulated "
        f"({result.grid_size - result.simulated} brute-force runs avoided)"
    )
    unsupported = result.removed.get("format_unsupported", {}).get("configurations", 0)
    if unsupported:
        console.print(f"{unsupported} configurations hold a weight or KV format their GPU cannot run")
    for line in [*placement_lines(result), *removed_lines(result), *transfer_lines(result)]:
        console.print(line, markup=False)
    if result.best is None:
        console.print("no configuration met the SLO: raise --max-gpus, add --gpus, or lower the rate")
    else:
        b = result.best
        console.print(f"cheapest meeting the SLO: {b['config']} at ${b['cost_per_hour']:.2f}/hour")
        console.print("reproduce: sim run SCENARIO " + " ".join(f"--set '{a}'" for a in result.reproduce(b)))
        deploy = deployment(result)
        for g in (deploy or {}).get("groups", []):
            console.print(f"launch {g['count']} x {g['name']} ({g['role']}): {g['command']}", markup=False)
    for line in sustained_sentences(result):
        console.print(line, markup=False)
    console.print(f"plan in {out_dir}/ (plan.json, plan.parquet, index.html)")

"""`sim report DIR`: read the run and sweep records, build the charts, write index.html and one PNG each."""

from __future__ import annotations

from html import escape
from pathlib import Path

from sim.io.errors import SimError
from sim.io.outputs import atomic_write, write_text
from sim.io.paths import out_folder_problem, shown
from sim.records import stats
from sim.report import charts, frames, grid
from sim.report.coverage import latency_note, overload_sentence, points_text
from sim.report.fleet import fleet_sections
from sim.report.headline import SUMMARY_COLUMNS, capacity_sentence, run_sentence, slo_text, summary_rows
from sim.report.inputs import PolicyRun, ReportInputs, load_inputs
from sim.report.lora import lora_sections
from sim.report.page import Section, chart_png, chart_spec, render_page
from sim.report.quantisation import quantisation_sections
from sim.report.slo import GOODPUT_SECTION, judge_by_page_slo
from sim.report.speculative import speculative_sections

SWEEP_METRICS = [f"{m}_{q}" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p99")] + [
    "requests_per_s",
    "goodput_per_s",
]
TIMELINE_REQUESTS = 60
PNG_DIR = "charts"


def need(what: str, command: str, inputs: ReportInputs) -> str:
    """A missing chart's box: the command that writes its records into the folder this page reads."""
    out = "" if inputs.folder is None else f" --out {escape(str(inputs.folder))}"
    code = f"<code>sim {command} SCENARIO.toml{out}</code>"
    return f"This chart needs {what}: run {code}, then this command again."


def _series(inputs: ReportInputs) -> list[str]:
    names = [r.policy for r in inputs.runs]
    if inputs.points is not None:
        names += [s for s in grid.with_series(inputs.points)["series"].unique().sort() if s not in names]
    return names


def capacities(inputs: ReportInputs) -> list[grid.CapacityMark]:
    """From capacity.json (bisected) when the sweep wrote one, else bracketed on the grid."""
    if inputs.capacity is not None:
        found = grid.capacity_from_json(inputs.capacity)
        if found:
            return found
    if inputs.points is None or inputs.scenario is None:
        return []
    slo = inputs.scenario.slo
    return grid.capacity_from_grid(inputs.points, stats.SloBounds(slo.ttft_s, slo.tpot_s, slo.e2e_s))


def sweep_sections(inputs: ReportInputs, series: list[str], caps: list[grid.CapacityMark]) -> list[Section]:
    means = grid.summarize_points(inputs.points, SWEEP_METRICS) if inputs.points is not None else None
    have = means is not None and means.height > 0
    return [
        Section(
            "latency_vs_rate",
            "Latency against arrival rate",
            "Median (solid) and p99 (dashed) of time to first token, time per output token and end-to-end "
            "latency (means over replications), with 95% confidence bands computed in log space, as the "
            "axis is. Look for the knee: the rate where p99 leaves the floor and climbs steeply is where a "
            f"policy starts to queue. {points_text(inputs.points)}",
            charts.latency_vs_rate(grid.log_bands(means), series) if have and means is not None else None,
            need("sweep results", "sweep", inputs),
        ),
        Section(
            "throughput_vs_rate",
            "Throughput against arrival rate",
            "Finished requests per second; the dashed diagonal is the offered load. A policy keeps up while "
            "it follows the diagonal; where it bends away, requests pile up in the queue.",
            charts.throughput_vs_rate(means, series) if have and means is not None else None,
            need("sweep results", "sweep", inputs),
        ),
        Section(
            "goodput_vs_rate",
            "Goodput against arrival rate",
            f"Requests per second that meet the SLO ({slo_text(inputs.scenario)}). The vertical rules mark "
            f"each policy's capacity: the highest rate at which the p99 latencies (mean over replications) "
            "still meet the SLO and no run is overloaded. Goodput falling while throughput holds means "
            "the extra work is served too late to count.",
            charts.goodput_vs_rate(means, series, caps)
            if have and means is not None and GOODPUT_SECTION not in inputs.withheld
            else None,
            inputs.withheld.get(GOODPUT_SECTION, need("sweep results", "sweep", inputs)),
        ),
    ]


def _named(runs: list[PolicyRun]) -> list[tuple[str, dict[str, object]]]:
    return [(r.policy, r.summary) for r in runs]


def run_sections(inputs: ReportInputs, series: list[str]) -> list[Section]:
    runs = inputs.runs
    rate = inputs.run_rate
    at = f" at {rate:.3g} req/s" if rate else ""
    return [
        Section(
            "latency_cdf",
            f"Latency distributions{at}",
            "Cumulative share of finished requests by time to first token and end-to-end latency. A curve "
            "further left is faster; a long flat tail is the requests that waited behind others. "
            f"{escape(latency_note(_named(runs), 'The curves cover'))}",
            charts.latency_cdf(frames.cdfs(runs), series) if runs else None,
            need("per-policy runs", "run", inputs),
        ),
        Section(
            "convoy_timeline",
            "Convoy timeline",
            f"The same {TIMELINE_REQUESTS} requests from the middle of the run under each policy: queued "
            "(grey), prefill (orange), decoding their own tokens (blue) and padding (red), the slot a "
            "request still holds after its last token until its batch ends. Red bars are short requests "
            "stuck behind long ones: the convoy effect. Under continuous batching a request leaves as "
            "soon as it is done.",
            charts.convoy_timeline(frames.timeline(runs, TIMELINE_REQUESTS)) if runs else None,
            need("per-policy runs", "run", inputs),
        ),
        Section(
            "utilisation",
            "Batch size, queue and KV use over time",
            "Averages over short time bins (idle time counts as zero). A large batch with a growing queue "
            "means the engine is busy with work that does not let newcomers in; KV allocated far above KV "
            "used is memory reserved for tokens that are never generated.",
            charts.utilisation_over_time(frames.timeseries(runs), series) if runs else None,
            need("per-policy runs", "run", inputs),
        ),
        Section(
            "kv_breakdown",
            "Where the KV memory goes",
            "Time-averaged split of the KV cache while the engine runs: token states actually stored, "
            "memory reserved for a request but unused (padding, reservations for the longest possible "
            "output, partly filled blocks), and free memory.",
            charts.kv_breakdown(frames.kv_shares(runs)) if runs else None,
            need("per-policy runs", "run", inputs),
        ),
    ]


def _meta(inputs: ReportInputs) -> str:
    replica = inputs.runs[0].summary.get("replica", {}) if inputs.runs else {}
    bits = []
    if replica:
        bits.append(f"{replica.get('model', '?')} on {replica.get('gpu', '?')} (TP {replica.get('tp', 1)})")
    if inputs.runs:
        bits.append("policies: " + ", ".join(r.policy for r in inputs.runs))
    bits.append(f"SLO: {slo_text(inputs.scenario)}")
    return " · ".join(bits)


def build_report(report_dir: Path, scenario_file: Path | None = None, png: bool = True) -> list[Path]:
    """Write `report_dir/index.html` and `report_dir/charts/<chart>.png`; return the paths written."""
    inputs = load_inputs(report_dir, scenario_file)
    judge_by_page_slo(inputs)
    if png and (why := out_folder_problem(report_dir / PNG_DIR)) is not None:
        raise SimError(f"{shown(report_dir / PNG_DIR)}: {why}")
    series = _series(inputs)
    caps = capacities(inputs)
    sweep, per_run = sweep_sections(inputs, series, caps), run_sections(inputs, series)
    sections = sweep + per_run if inputs.points is not None else per_run + sweep  # missing charts last
    fleet_sweep = inputs.points if inputs.scenario is not None and inputs.scenario.cluster else None
    sections += fleet_sections(inputs.runs, fleet_sweep, series)
    sections += speculative_sections(inputs, series)
    sections += lora_sections(inputs.points, inputs.runs)
    sections = quantisation_sections(inputs, caps) + sections
    headline = [  # an overloaded run is said to be so before any latency
        line
        for line in (
            overload_sentence(_named(inputs.runs), inputs.run_rate),
            capacity_sentence(caps, inputs.scenario),
            run_sentence(inputs.runs, inputs.run_rate),
        )
        if line
    ]
    table = (SUMMARY_COLUMNS, summary_rows(inputs.runs, caps)) if inputs.runs else None
    table_note = latency_note(_named(inputs.runs)) if inputs.runs else ""
    specs = {s.key: chart_spec(s.chart) for s in sections if s.chart is not None}
    title = f"servesim report: {inputs.name}"
    html = render_page(
        title,
        inputs.description,
        _meta(inputs),
        headline,
        table,
        sections,
        specs,
        PNG_DIR,
        inputs.notes,
        table_note,
    )
    index = report_dir / "index.html"
    write_text(index, html)
    written = [index]
    if png:
        for key, spec in specs.items():
            path = report_dir / PNG_DIR / f"{key}.png"
            image = chart_png(spec)
            atomic_write(path, lambda p, image=image: Path(p).write_bytes(image))
            written.append(path)
    return written

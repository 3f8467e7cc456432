"""One SLO per page: every figure the page judges by an SLO is judged by the SLO it states.

A run's goodput and SLO attainment (its `summary.json`), a sweep's goodput (its points) and its bisected
capacities (`capacity.json`) were judged, when they ran, by the SLO of their scenario, which their
manifests record. The page states its scenario's SLO (the `--scenario` file, else the sweep's, else the
runs'). Where a record was judged by another, the page recomputes it under the stated SLO as far as the
records allow, and says so: a run's goodput and attainment from its request records, the capacities
bracketed on the sweep's grid (p99 latencies and overload do not depend on the SLO). The sweep's goodput
against the rate cannot be recomputed (its points keep no per-request records): that chart is left out,
with the reason.
"""

from __future__ import annotations

from html import escape
from typing import Any

from sim.records.summary import Slo, slo_figures
from sim.report.headline import bounds_text
from sim.report.inputs import PolicyRun, ReportInputs

GOODPUT_SECTION = "goodput_vs_rate"


def as_slo(bounds: Any) -> Slo | None:
    """The bounds of an `[slo]` table, or of its JSON form in a manifest or capacity.json (None when
    there is none to read)."""
    if isinstance(bounds, dict):
        values = [bounds.get(k) for k in ("ttft_s", "tpot_s", "e2e_s")]
    elif bounds is not None and all(hasattr(bounds, k) for k in ("ttft_s", "tpot_s", "e2e_s")):
        values = [bounds.ttft_s, bounds.tpot_s, bounds.e2e_s]
    else:
        return None
    if not all(v is None or isinstance(v, int | float) for v in values):
        return None
    return Slo(*(None if v is None else float(v) for v in values))


def run_slo(run: PolicyRun) -> Slo | None:
    """The SLO a run was judged by: its manifest's (the validated scenario it ran)."""
    compared = run.manifest.get("compared")
    return as_slo(compared.get("slo")) if isinstance(compared, dict) else None


def _judged_by(slos: list[Slo | None]) -> str:
    said = sorted({bounds_text(s) if s is not None else "an SLO not recorded" for s in slos})
    return " and ".join(said)


def _rejudge(run: PolicyRun, slo: Slo) -> dict[str, Any]:
    """The run's summary with its goodput and SLO attainment judged by `slo` from its request records
    (goodput unknown without the measurement window it is a rate over)."""
    window = run.summary.get("window_s")
    if isinstance(window, int | float):
        figures = slo_figures(run.requests, slo, float(window))
    else:
        figures = {**slo_figures(run.requests, slo, 0.0), "goodput_per_s": None}
    return {**run.summary, **figures}


def judge_by_page_slo(inputs: ReportInputs) -> None:
    """Make every SLO figure of `inputs` one judged by the SLO of `inputs.scenario` (see the module
    docstring), adding a note for each kind of record recomputed and the reason for a chart left out."""
    if inputs.scenario is None:
        return
    page = as_slo(inputs.scenario.slo)
    assert page is not None
    stated = bounds_text(page)
    stale = [run for run in inputs.runs if run_slo(run) != page]
    if stale:
        was = _judged_by([run_slo(run) for run in stale])
        for run in stale:
            run.summary = _rejudge(run, page)
        inputs.notes.append(
            f"The per-policy runs of {', '.join(r.policy for r in stale)} were judged by {was} when they "
            f"ran; their goodput and SLO attainment here are recomputed from their request records under "
            f"{stated}, the SLO this page states."
        )
    if inputs.points is None:
        return
    sweep = as_slo(inputs.sweep_scenario.slo) if inputs.sweep_scenario is not None else None
    bisected = inputs.capacity
    if bisected is not None and (as_slo(bisected.get("slo")) or sweep) != page:
        was = _judged_by([as_slo(bisected.get("slo")) or sweep])
        inputs.capacity = None
        inputs.notes.append(
            f"The sweep's bisected capacities (capacity.json) were judged by {was}; the capacities here "
            f"are bracketed on the sweep's grid under {stated} instead."
        )
    if sweep != page:
        was = _judged_by([sweep])
        inputs.withheld[GOODPUT_SECTION] = (
            f"The sweep's goodput was judged by {escape(was)}, not by {escape(stated)}, the SLO this page "
            "states, and its points keep no per-request records to judge it again: run <code>sim sweep"
            "</code> with this SLO, then this command again."
        )

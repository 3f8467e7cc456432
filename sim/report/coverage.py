"""How many requests a latency figure covers, said beside it: TTFT, TPOT, ITL and E2E exist only for the
requests that finished (one still queued or running at the end, or rejected, has none), so an overloaded
run's latencies describe its survivors. Counts come from a summary's `requests` block or a sweep point's
`arrived` / `finished` columns; an overloaded run (`summary.json`'s `overloaded`, the backlog test of
sim/records/overload.py) is named before any latency."""

from __future__ import annotations

from typing import Any

import polars as pl


def count_text(covered: int, arrived: int, noun: str = " requests") -> str:
    """`784 of 1,738 requests (954 unfinished)`; `120 of 120 requests (all finished)`."""
    return metric_text("ttft", covered, covered, arrived, noun)


def metric_text(metric: str, covered: int, finished: int, arrived: int, noun: str = " requests") -> str:
    """What one latency (a name of `LATENCY_METRICS`) covers, with `covered` from
    `sim.records.summary.latency_counts`: `590 of 611 requests (21 never scheduled)` for the queue wait;
    `31 of 611 requests (578 unfinished, 2 of one token)` for TPOT."""
    if metric == "queue_wait":
        rest = arrived - covered
        tail = f"{rest:,} never scheduled" if rest else "all scheduled"
        return f"{covered:,} of {arrived:,}{noun} ({tail})"
    parts = [f"{arrived - finished:,} unfinished"] if arrived > finished else []
    if finished > covered:
        parts.append(f"{finished - covered:,} of one token")
    return f"{covered:,} of {arrived:,}{noun} ({', '.join(parts) or 'all finished'})"


def summary_counts(summary: dict[str, Any]) -> tuple[int, int] | None:
    """(finished, arrived) of a run's summary, None when it has no such counts."""
    req = summary.get("requests", {})
    finished, arrived = req.get("finished"), req.get("arrived")
    if isinstance(finished, int) and isinstance(arrived, int):
        return finished, arrived
    return None


def summary_text(summary: dict[str, Any]) -> str:
    """`count_text` of the finished requests of a run's summary."""
    counts = summary_counts(summary)
    return "an unknown number of requests" if counts is None else count_text(*counts)


def runs_text(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """`static 33 of 611 requests (578 unfinished), continuous 120 of 120 requests (all finished)`."""
    return ", ".join(f"{name} {summary_text(summary)}" for name, summary in runs)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def overload_sentence(runs: list[tuple[str, dict[str, Any]]], rate: float | None) -> str | None:
    """The headline's first line when any run is overloaded: which, and how few of its requests its
    latencies cover; None when no run is."""
    over = [(name, s) for name, s in runs if s.get("overloaded")]
    if not over:
        return None
    at = f" at {rate:.3g} req/s" if rate else ""
    who = _names([name for name, _ in over])
    one = len(over) == 1
    verb = "piles up requests faster than it finishes" if one else "pile up requests faster than they finish"
    return (
        f"Overloaded{at}: {who} {verb} them, so the latencies below cover only the requests that "
        f"finished: {runs_text(over)}."
    )


def latency_note(runs: list[tuple[str, dict[str, Any]]], what: str = "TTFT, TPOT and E2E cover") -> str:
    """The sentence under a table or chart of per-run latencies (`what` names them)."""
    return f"{what} only the requests that finished: {runs_text(runs)}."


def points_text(points: pl.DataFrame | None) -> str:
    """What the latencies of a sweep's points cover: every run's finished requests, added up, and how many
    runs were overloaded (empty without points)."""
    if points is None or points.is_empty() or not {"arrived", "finished"} <= set(points.columns):
        return ""
    arrived, finished = int(points["arrived"].sum()), int(points["finished"].sum())
    runs = points.height
    over = int(points["overloaded"].fill_null(False).sum()) if "overloaded" in points.columns else 0
    overloaded = f"; {over:,} of the {runs:,} runs overloaded" if over else ""
    return (
        f"Latencies cover only the requests that finished: over the sweep's {runs:,} runs, "
        f"{count_text(finished, arrived)}{overloaded}."
    )

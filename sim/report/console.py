"""Terminal output: rich tables comparing policies, and progress displays for long work."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from sim.config.scenario import Scenario

Update = Callable[..., None]  # update(completed, **fields)


@contextmanager
def progress(
    description: str, total: float | None, unit: str, console: Console | None = None, count: str = ""
) -> Iterator[Update | None]:
    """A rich progress bar on stderr while the block runs, when stderr is a terminal; yields its
    `update(completed, n=...)`, or None elsewhere, so that callers (and the engine) do no progress work at
    all off a terminal. `unit` names what `completed` counts; `count`, if given, names the `n` field."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {unit}"),
        *([TextColumn(f"{{task.fields[n]:,}} {count}")] if count else []),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total, n=0)

        def update(completed: float, **fields: Any) -> None:
            bar.update(task, completed=min(completed, total) if total else completed, **fields)

        yield update


@contextmanager
def run_progress(
    policy: str, duration_s: float | None, max_requests: int | None, console: Console | None = None
) -> Iterator[Callable[[float, int], None] | None]:
    """`progress` for one simulated run, as the hook `run_policy` takes: simulated seconds against the
    horizon (or requests against `max_requests` when the horizon has no duration). None off a terminal."""
    by_time = duration_s is not None
    total = duration_s if by_time else max_requests
    unit = "s simulated" if by_time else "requests"
    with progress(policy, total, unit, console, "requests arrived") as update:
        if update is None:
            yield None
            return

        def hook(sim_time: float, arrived: int, update: Update = update) -> None:
            update(sim_time if by_time else arrived, n=arrived)

        yield hook


class Stopwatch:
    """Wall seconds since creation, for one-line summaries of long work."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.start:.1f} s"


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


def print_comparison(scenario: Scenario, summaries: list[dict[str, Any]], out_dir: Path) -> None:
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
    for metric in ("queue_wait", "ttft", "tpot", "itl", "e2e"):
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
    rejected = rejection_lines(summaries)
    if rejected:
        console.print("rejected requests, by reason:", highlight=False)
        for line in rejected:
            console.print(line, markup=False, highlight=False)
    console.print(f"records and summaries in {out_dir}/<policy>/")

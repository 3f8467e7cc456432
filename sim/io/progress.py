"""Progress displays for long work: a rich bar on stderr when it is a terminal, nothing elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

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
    # imported here: off a terminal (records piped, tests, sweep workers) no bar is drawn
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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

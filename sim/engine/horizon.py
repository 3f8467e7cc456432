"""When a run's arrivals stop, and whether it then drains."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Horizon:
    duration_s: float | None = None  # arrivals stop here; the run stops here unless `drain`
    max_requests: int | None = None  # arrivals stop after this many
    drain: bool = False  # keep serving after the last arrival until every admitted request ends
    max_waiting: int | None = None  # admission control: reject arrivals when this many already wait

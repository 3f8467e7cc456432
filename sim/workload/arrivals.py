"""Arrival processes: the arrival times of an open-loop workload, generated lazily in numpy chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from sim.config.workload import (
    StagedArrival,
)

CHUNK = 8192  # requests generated per numpy batch


@dataclass(slots=True)
class Chunk:
    """Arrival times (sorted, seconds) and, for traces, per-request columns that override sampling."""

    times: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)


class ArrivalProcess:
    """An open-loop arrival process: `chunks(rng)` yields sorted arrival times in batches."""

    finite: bool = False
    columns: frozenset[str] = frozenset()  # per-request columns a trace provides

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        raise NotImplementedError


class RenewalProcess(ArrivalProcess):
    """Independent gaps drawn by `gaps(rng, n)`, starting from t = 0."""

    def __init__(self, gaps: Callable[[np.random.Generator, int], np.ndarray]) -> None:
        self._gaps = gaps

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        t = 0.0
        while True:
            times = t + np.cumsum(self._gaps(rng, CHUNK))
            t = float(times[-1])
            yield Chunk(times)


class DeterministicProcess(ArrivalProcess):
    def __init__(self, rate: float) -> None:
        self._rate = rate

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        start = 0
        while True:
            yield Chunk(np.arange(start, start + CHUNK, dtype=np.float64) / self._rate)
            start += CHUNK


class StagedProcess(ArrivalProcess):
    finite = True

    def __init__(self, config: StagedArrival) -> None:
        self._c = config

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        t0 = 0.0
        for rate, duration in self._c.stages:
            end = t0 + duration
            if rate > 0 and self._c.exact_count:
                n = round(rate * duration)
                if n > 0:
                    cum = np.cumsum(rng.exponential(1.0, n + 1))
                    times = t0 + cum[:-1] * (duration / cum[-1])
                    for i in range(0, n, CHUNK):
                        yield Chunk(times[i : i + CHUNK])
            elif rate > 0:
                t = t0
                while t < end:
                    times = t + np.cumsum(rng.exponential(1.0 / rate, CHUNK))
                    t = float(times[-1])
                    keep = times[times < end]
                    if keep.size:
                        yield Chunk(keep)
            t0 = end

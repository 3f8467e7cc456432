"""Trace replay: arrival times, lengths and per-request columns read from a CSV or JSON-lines trace.

A trace field is read from the first of its names in `TRACE_COLUMNS` that the trace has; any other column
(an id, a timestamp, an acceptance rate) is left alone. A length read under another name is not guessed: a
trace that lacks a field's names but has a column that looks like that length (`prompt_len`, `input_tokens`,
`completion_tokens`, Azure 2023's `ContextTokens`: a prompt or output word and a length word, `LENGTH_WORDS`)
is refused, naming the column found and the names read, rather than run with lengths drawn from
`[workload]` while the trace's own sit unread. The names are not mapped because their meaning differs
between traces (a `prompt_len` in characters, an `input_tokens` that counts cached tokens or not); the
user renames the column, or drops it to draw the lengths from `workload.prompt` / `workload.output`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.config.lengths import resolve
from sim.config.workload import TraceArrival
from sim.io.errors import SimError
from sim.io.limits import (
    MAX_ID,
    MAX_SECONDS,
    MAX_TOKENS,
)
from sim.io.tables import Table, read_table
from sim.workload.arrivals import CHUNK, ArrivalProcess, Chunk
from sim.workload.sampling import SAMPLING_COLUMNS

# Column names accepted for each trace field, in order of preference.
TRACE_COLUMNS: dict[str, tuple[str, ...]] = {
    "arrival": ("arrival_s", "arrived_at"),
    "prompt": ("prompt_tokens", "num_prefill_tokens"),
    "output": ("output_tokens", "num_decode_tokens"),
    "prefix_group": ("prefix_group",),
    "prefix_len": ("prefix_len",),
    "adapter": ("adapter",),
}


# Words that make a column look like a field's length, when it has none of that field's names.
LENGTH_WORDS: dict[str, frozenset[str]] = {
    "prompt": frozenset({"prompt", "input", "prefill", "context", "request", "query"}),
    "output": frozenset({"output", "completion", "decode", "generated", "generation", "response", "answer"}),
}
_TOKEN_WORDS = frozenset({"len", "length", "lengths", "tokens", "token", "toks", "tok", "ntokens"})


def _words(name: str) -> set[str]:
    """A column name's lower-case words: `ContextTokens`, `context_tokens` and `context-tokens` alike."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w}


def _unread_length(columns: list[str], key: str) -> str | None:
    """The first column that looks like the `key` length (`prompt`, `output`) under a name not read."""
    for name in columns:
        words = _words(name)
        if words & LENGTH_WORDS[key] and words & _TOKEN_WORDS:
            return name
    return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# Each trace column's bounds: token counts within what a request can hold, group ids exact in float64.
TRACE_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("prompt", 1, MAX_TOKENS),
    ("output", 1, MAX_TOKENS),
    ("prefix_group", -1, MAX_ID),
    ("prefix_len", 0, MAX_TOKENS),
    ("adapter", -1, MAX_ID),
)


class TraceProcess(ArrivalProcess):
    finite = True

    def __init__(self, config: TraceArrival, base_dir: Path) -> None:
        path = resolve(config.path, base_dir)
        table = read_table(path, config.format)
        found = {
            k: next((n for n in names if n in table.columns), None) for k, names in TRACE_COLUMNS.items()
        }
        if found["arrival"] is None:
            raise SimError(
                f"{path}: no arrival column (expected one of {', '.join(TRACE_COLUMNS['arrival'])})"
            )
        for key in LENGTH_WORDS:
            unread = None if found[key] is not None else _unread_length(table.columns, key)
            if unread is not None:
                names = " or ".join(repr(n) for n in TRACE_COLUMNS[key])
                raise SimError(
                    f"{path}: column {unread!r} looks like {key} lengths but is not read: a trace's {key} "
                    f"lengths are read from {names}; rename the column, or drop it to draw the lengths "
                    f"from workload.{key}"
                )
        if len(table) == 0:
            raise SimError(f"{path}: trace has no rows")
        times = self._bounded(table, found["arrival"], 0, MAX_SECONDS / config.time_scale, whole=False)
        order = np.argsort(times, kind="stable")
        self._times = times[order] * config.time_scale
        self._cols: dict[str, np.ndarray] = {}
        for key, low, high in TRACE_BOUNDS:
            name = found[key]
            if name is not None:
                self._cols[key] = self._bounded(table, name, low, high, whole=True)[order].astype(np.int64)
        for key, (low, high, whole) in SAMPLING_COLUMNS.items():  # per-request sampling parameters
            if key in table.columns:
                self._cols[key] = self._bounded(table, key, low, high, whole=whole)[order]
        cols = self._cols
        if "prompt" in cols and "prefix_len" in cols:
            over = np.flatnonzero(cols["prefix_len"] > cols["prompt"])
            if over.size:
                line = int(table.lines[order[over[0]]])
                raise SimError(
                    f"{path}: line {line}: column {found['prefix_len']!r}: exceeds the prompt length"
                )
        self.columns = frozenset(self._cols)
        self.lines = table.lines[order]  # each request's line in the file
        self.path = path
        self.column_names = {k: v for k, v in found.items() if v is not None}

    @staticmethod
    def _bounded(table: Table, name: str, low: float, high: float, whole: bool) -> np.ndarray:
        """A column's values, each a number in [low, high] (a whole number if `whole`)."""
        v = table.numbers(name)
        bad = (v < low) | (v > high)
        if whole:
            bad |= v != np.rint(v)
        if bad.any():
            line = int(table.lines[int(np.argmax(bad))])
            kind = "a whole number" if whole else "a number"
            raise SimError(
                f"{table.path}: line {line}: column {name!r}: expected {kind} in [{_num(low)}, {_num(high)}]"
            )
        return v

    def __len__(self) -> int:
        return int(self._times.size)

    def count_before(self, horizon_s: float) -> int:
        """Requests arriving before `horizon_s` (scaled time)."""
        return int(np.searchsorted(self._times, horizon_s, side="left"))

    def column_mean(self, key: str) -> float | None:
        """Mean of a per-request column (`prompt`, `output`, ...), None if the trace has none."""
        values = self._cols.get(key)
        return None if values is None else float(values.mean())

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        for i in range(0, self._times.size, CHUNK):
            yield Chunk(self._times[i : i + CHUNK], {k: v[i : i + CHUNK] for k, v in self._cols.items()})

"""The recorder's step columns made into a frame, and how a growing column gets past a view of it."""

from __future__ import annotations

from array import array

import numpy as np
import polars as pl

from sim.records.columns import STEP_INT_COLUMNS, STEP_STORED_INTS


def steps_frame(
    first: int,
    win_start: int,
    prev_end: float,
    ends: array,
    durations: array,
    step_starts: dict[int, float],
    step_capacity: dict[int, int],
    step_ints: np.ndarray,
    step_compute: bytearray,
) -> pl.DataFrame:
    """Steps `first` on (global step numbers) as a frame. `ends` and `durations` hold the steps from
    `win_start` on; a step starts at the previous one's end (`prev_end` before `first`) unless `step_starts`
    names it, and its KV capacity is the latest one `step_capacity` gives at or before it. `step_ints` holds
    the `STEP_STORED_INTS` columns, one row each."""
    n = len(step_compute)
    lo = first - win_start
    end = np.frombuffer(ends, dtype=np.float64, count=n, offset=lo * 8)
    start = np.empty_like(end)
    if n:
        start[0] = prev_end
        start[1:] = end[:-1]
    for step, t in step_starts.items():
        start[step - first] = t
    cols: dict[str, object] = {
        "start": start,
        "duration": np.frombuffer(durations, np.float64, count=n, offset=lo * 8).copy(),
    }
    stored = dict(zip(STEP_STORED_INTS, step_ints, strict=True))
    capacity = np.empty(n, np.int64)
    changes = list(step_capacity.items())
    for i, (step, cap) in enumerate(changes):
        capacity[max(step - first, 0) : changes[i + 1][0] - first if i + 1 < len(changes) else n] = cap
    stored["kv_capacity"] = capacity
    for name in STEP_INT_COLUMNS:
        cols[name] = stored[name] if name != "compute_bound" else np.frombuffer(step_compute, np.uint8)
    cols["waiting"] = stored["waiting"]
    frame = pl.DataFrame(cols).with_columns(pl.col("compute_bound").cast(pl.Boolean))
    return frame.with_row_index("step", offset=first)


def unshared(column: array, *values: float) -> array:
    """`column` copied with `values` appended: how a growing column gets past a view of it that outlives
    its use (a finished frame that a sampling profiler still holds, as dask workers sample their tasks),
    which makes the array refuse to grow (BufferError). The column goes on as the copy; the old one is left
    to the view."""
    out = array(column.typecode, column)
    out.extend(values)
    return out

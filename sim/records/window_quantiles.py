"""ITL quantiles of many requests at once: order statistics of windows of the recorded step durations; the
gaps of a request that sat out steps (`stall_windows`)."""

from __future__ import annotations

import numpy as np


def window_quantiles(
    durations: np.ndarray,
    lo: np.ndarray,
    n: np.ndarray,
    group: int = 32,
    short: int = 128,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p50, p99 (as `np.quantile`'s linear method, bit for bit) and max of the windows
    `durations[lo[k] : lo[k] + n[k]]` (each `n[k] >= 1`), for many windows at once. Only the order statistics
    the quantiles read are kept: windows of at most `short` steps are sorted `group` at a time, as the rows of
    one matrix padded with +inf past their ends (one sort call for many small ones); a longer one is sorted on
    its own, a view of the durations, where padding and gathering would cost more than the call. Sorting beats
    partitioning at the five ranks with numpy 2's sort: on the benchmark runs' own windows the partitions
    took 1.8 times as long (benchmarks/bench_itl_quantiles.py)."""
    end = n - 1
    v50, v99 = end * 0.5, end * 0.99
    i50, i99 = v50.astype(np.int64), v99.astype(np.int64)
    # each window's ranks read: the two around p50, the two around p99, and its largest
    need = np.stack((i50, np.minimum(i50 + 1, end), i99, np.minimum(i99 + 1, end), end), axis=1)
    stats = np.empty((len(lo), 5))
    small = np.flatnonzero(n <= short)
    order = small[np.argsort(n[small], kind="stable")]
    for start in range(0, len(order), group):
        rows = order[start : start + group]
        lens = n[rows]
        cols = np.arange(int(lens[-1]))
        vals = durations[lo[rows, None] + np.minimum(cols, lens[:, None] - 1)]
        vals[cols >= lens[:, None]] = np.inf
        vals.sort(axis=1)
        stats[rows] = np.take_along_axis(vals, need[rows], axis=1)
    sort = np.sort
    for k in np.flatnonzero(n > short).tolist():
        first = int(lo[k])
        stats[k] = sort(durations[first : first + int(n[k])])[need[k]]
    top = stats[:, 4]
    quantiles = []
    for v, i, a, b in ((v50, i50, stats[:, 0], stats[:, 1]), (v99, i99, stats[:, 2], stats[:, 3])):
        t = v - i
        d = b - a
        got = np.where(t >= 0.5, b - d * (1 - t), a + d * t)
        quantiles.append(np.where(v >= end, top, got))
    return quantiles[0], quantiles[1], top.copy()


def stall_windows(
    durations: np.ndarray, lo: int, count: int, waits: list[tuple[int, int, float]], first: int
) -> np.ndarray:
    """The gaps of a request with waits: the durations of the `count` steps from `lo` (local), less the steps
    of each wait (global step numbers, `first` the local 0), with each wait's gap instead."""
    keep = np.ones(count, bool)
    for a, r, _ in waits:
        keep[max(a - first - lo, 0) : r - first - lo + 1] = False
    window = durations[lo : lo + count]
    return np.concatenate((window[keep], np.array([g for _, _, g in waits])))

"""ITL quantiles of many requests at once: order statistics of windows of the recorded step durations; the
gaps of a request that sat out steps (`stall_windows`)."""

from __future__ import annotations

import numpy as np


def window_quantiles(
    durations: np.ndarray, lo: np.ndarray, n: np.ndarray, group: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p50, p99 (as `np.quantile`'s linear method, bit for bit) and max of the windows
    `durations[lo[k] : lo[k] + n[k]]` (each `n[k] >= 1`), for many windows at once: windows of similar length
    are sorted together as the rows of one matrix, padded with +inf past their ends, and the order statistics
    are read by index."""
    count = len(lo)
    p50, p99, top = np.empty(count), np.empty(count), np.empty(count)
    order = np.argsort(n, kind="stable")
    last = len(durations) - 1
    for start in range(0, count, group):
        rows = order[start : start + group]
        lens = n[rows]
        width = int(lens[-1])
        cols = np.arange(width)
        vals = durations[np.minimum(lo[rows, None] + cols, last)]
        vals[cols >= lens[:, None]] = np.inf
        vals.sort(axis=1)
        r = np.arange(len(rows))
        end = lens - 1
        top[rows] = vals[r, end]
        for q, out in ((0.5, p50), (0.99, p99)):
            v = end * q
            i = v.astype(np.int64)
            t = v - i
            a, b = vals[r, i], vals[r, np.minimum(i + 1, end)]
            d = b - a
            got = np.where(t >= 0.5, b - d * (1 - t), a + d * t)
            out[rows] = np.where(v >= end, top[rows], got)
    return p50, p99, top


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

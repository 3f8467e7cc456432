"""Each request's sampling parameters: a row of one table of distinct parameter sets, drawn from
`[workload.sampling]`'s profiles by share, with a trace's columns of the same names set over them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sim.config.sampling import MAX_LOGPROBS, SamplingWorkload
from sim.core.sampling import SAMPLING_KEYS, SamplingParams

# Trace columns read as sampling parameters: (lowest, highest, whole number), vLLM's ranges.
SAMPLING_COLUMNS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 100.0, False),
    "top_p": (1e-9, 1.0, False),
    "top_k": (-1, 1 << 30, True),
    "min_p": (0.0, 1.0, False),
    "repetition_penalty": (1e-9, 2.0, False),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "logprobs": (0, MAX_LOGPROBS, True),
}


class SamplingDraws:
    """The run's table of parameter sets (`table`), and each request's row in it."""

    def __init__(self, config: SamplingWorkload | None) -> None:
        base, probs = config.table() if config is not None else ((SamplingParams(),), (1.0,))
        self.configured = config is not None
        self.table: list[SamplingParams] = []
        self._rows: dict[SamplingParams, int] = {}
        self._profiles = np.array([self._row(p) for p in base], dtype=np.int64)
        self._probs = np.array(probs, dtype=np.float64)

    def _row(self, params: SamplingParams) -> int:
        row = self._rows.get(params)
        if row is None:
            row = self._rows[params] = len(self.table)
            self.table.append(params)
        return row

    def __call__(self, rng: np.random.Generator, n: int, cols: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Rows of the next n requests (None when neither the table nor the trace gives parameters)."""
        given = [k for k in SAMPLING_COLUMNS if k in cols]
        if not self.configured and not given:
            return None
        if self._profiles.size > 1:
            rows = self._profiles[rng.choice(self._profiles.size, n, p=self._probs)]
        else:
            rows = np.full(n, self._profiles[0], dtype=np.int64)
        if not given:
            return rows
        out = np.empty(n, dtype=np.int64)
        values = [cols[k].tolist() for k in given]
        for i, row in enumerate(rows.tolist()):
            fields = {
                k: (int(v[i]) if SAMPLING_COLUMNS[k][2] else float(v[i]))
                for k, v in zip(given, values, strict=True)
            }
            base = self.table[row]
            out[i] = self._row(SamplingParams(**{**{k: getattr(base, k) for k in SAMPLING_KEYS}, **fields}))
        return out

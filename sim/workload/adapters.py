"""Which LoRA adapter each request names: draws from the adapters' popularity."""

from __future__ import annotations

import numpy as np

from sim.config.lora import LoraWorkload


def popularity(config: LoraWorkload) -> np.ndarray:
    """Each adapter's probability: uniform, or Zipf (1 / (i + 1)^s, normalised)."""
    n = config.adapters
    if config.popularity == "uniform" or config.zipf_s == 0:
        return np.full(n, 1.0 / n)
    weights = np.arange(1, n + 1, dtype=np.float64) ** -config.zipf_s
    return weights / weights.sum()


class AdapterSampler:
    """Draws adapter ids by inverting the popularity's CDF (one uniform draw per request)."""

    def __init__(self, config: LoraWorkload) -> None:
        cdf = np.cumsum(popularity(config))
        cdf[-1] = 1.0
        self._cdf = cdf

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self._cdf, rng.random(n), side="right").astype(np.int64)

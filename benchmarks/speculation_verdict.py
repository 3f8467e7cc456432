"""Does speculative decoding pay at a given batch, with greedy and with top-p requests? Per decode step
of `scenarios/speculative-decoding.toml`'s model, GPU and proposers (Llama-3.1-70B on 4 x H100; the
Qwama-0.5B draft or n-gram lookup, k = 4, alpha = 0.5): tokens per second with speculation over tokens per
second without, every row at one context.

A plain step decodes one token a row; a speculative step verifies 1 + k tokens a row, samples each row and
each drafted position with the batch's sampler stages (sim/cost/sampler.py), runs the draft's catch-up pass
and its k - 1 further passes (as sim/engine/speculative.py times them), and emits (1 - alpha^(k+1)) /
(1 - alpha) tokens a row on average. `flat` is the calibration's sampler term, the one every run without
sampling parameters pays (a full-vocabulary sort per row and position).

    .venv/bin/python benchmarks/speculation_verdict.py --batch 1 128 --context 500 [--method ngram]
"""

from __future__ import annotations

import argparse

import numpy as np

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.speculative import SpeculativeConfig
from sim.core.sampling import SamplingParams
from sim.cost.draft import build_drafter
from sim.cost.roofline import CostModel
from sim.cost.sampler import BatchSampling, SamplerCost, resolve

SETTINGS = {
    "flat": None,
    "greedy": SamplingParams(temperature=0.0),
    "top-p": SamplingParams(temperature=0.7, top_p=0.9),
}


def verdict(
    batch: int,
    context: int,
    params: SamplingParams | None,
    method: str = "draft",
    alpha: float = 0.5,
    k: int = 4,
) -> float:
    """Speculation's speed-up in tokens per second at `batch` rows of `context` tokens."""
    cost = CostModel(load_model("llama-3.1-70b"), get_gpu("H100-SXM"), 4)
    draft_model = (
        {"draft_model": "qwama-0.5b-instruct", "draft_tensor_parallel_size": 1} if method == "draft" else {}
    )
    spec = SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=alpha, **draft_model)
    drafter = build_drafter(spec, cost)
    ctx = np.full(batch, context, np.int64)
    ones = np.ones(batch, np.int64)
    flat_row = cost.model.vocab_size * cost.cal.sampler_s_per_entry
    if params is None:
        plain_sampler, row_sampler, position_s = batch * flat_row, batch * flat_row, flat_row
    else:
        sampler = SamplerCost(
            cost.model.vocab_size, cost.hbm * cost.cal.bandwidth_eff, cost.cal.sampler_s_per_entry
        )
        b = BatchSampling()
        for _ in range(batch):
            b.add(resolve(params, {}), context)
        plain_sampler = row_sampler = sampler.seconds(b)
        position_s = sampler.vocab * sampler.entry_seconds(b)
    plain = cost.step_time(ones, ctx)[0] - batch * flat_row + plain_sampler
    verify = cost.step_time(ones * (k + 1), ctx)[0] - batch * flat_row + row_sampler + batch * k * position_s
    if drafter.cost is None:  # n-gram: a lookup on the host per row
        draft = drafter.host_s_per_row * batch
    else:
        draft = drafter.cost.step_time(ones * (k + 1), ctx)[0]
        draft += sum(drafter.cost.step_time(ones, ctx + k + 1 + i)[0] for i in range(k - 1))
    emitted = (1 - alpha ** (k + 1)) / (1 - alpha)
    return emitted * plain / (verify + draft)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--method", choices=["draft", "ngram"], default="draft")
    args = ap.parse_args()
    for batch in args.batch:
        row = ", ".join(
            f"{name} {verdict(batch, args.context, p, args.method):.2f}x" for name, p in SETTINGS.items()
        )
        print(f"{args.method}, batch {batch}: {row}")


if __name__ == "__main__":
    main()

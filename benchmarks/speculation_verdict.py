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

Another target and proposer: `--model`, `--gpu`, `--tp`, `-k`, `--alpha`, and `--method eagle` with
`--head-layers` and `--draft-vocab-size` (an EAGLE-3 head), e.g. EAGLE-3 on Llama-3.1-8B on one H100:

    .venv/bin/python benchmarks/speculation_verdict.py --model llama-3.1-8b-instruct --tp 1 --method eagle \
        --draft-vocab-size 32000 -k 6 --alpha 0.8 --batch 1
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
    target: tuple[str, str, int] = ("llama-3.1-70b", "H100-SXM", 4),
    head: tuple[int, int | None] = (1, None),
) -> float:
    """Speculation's speed-up in tokens per second at `batch` rows of `context` tokens; `target`: model,
    GPU and TP; `head`: an eagle head's layers and draft vocabulary."""
    model, gpu, tp = target
    cost = CostModel(load_model(model), get_gpu(gpu), tp)
    proposer: dict[str, object] = {}
    if method == "draft":
        proposer = {"draft_model": "qwama-0.5b-instruct", "draft_tensor_parallel_size": 1}
    elif method == "eagle":
        proposer = {"head_layers": head[0], "draft_vocab_size": head[1]}
    spec = SpeculativeConfig.model_validate(
        {"method": method, "num_speculative_tokens": k, "acceptance_rate": alpha, **proposer}
    )
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
    ap.add_argument("--method", choices=["draft", "ngram", "eagle"], default="draft")
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="H100-SXM")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("-k", type=int, default=4, help="draft tokens per step")
    ap.add_argument("--alpha", type=float, default=0.5, help="per-token acceptance")
    ap.add_argument("--head-layers", type=int, default=1, help="eagle: the head's decoder layers")
    ap.add_argument("--draft-vocab-size", type=int, default=None, help="eagle: an EAGLE-3 head's vocabulary")
    args = ap.parse_args()
    target = (args.model, args.gpu, args.tp)
    head = (args.head_layers, args.draft_vocab_size)
    for batch in args.batch:
        row = ", ".join(
            f"{name} {verdict(batch, args.context, p, args.method, args.alpha, args.k, target, head):.2f}x"
            for name, p in SETTINGS.items()
        )
        print(f"{args.method}, batch {batch}: {row}")


if __name__ == "__main__":
    main()

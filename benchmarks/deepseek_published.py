"""The published DeepSeek-V3 serving figures against the simulator's step model under the setup each source
states (docs/parallelism.md, "Published figures and the DeepSeek-V3 question").

Sources, read from their primary texts:
- LMSYS, "Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs"
  (2025-05-05; lm-sys/lm-sys.github.io, blog/2025-05-05-large-scale-ep.md): prefill on 4 nodes (EP32),
  16,384 tokens per device (the profile section's batch; TBO makes it fit); decode on 9 nodes (EP72), 256
  sequences per device at a 2,000-token KV length; the baseline "TP16 x 6" (two nodes a group, TP 16 and DP
  attention).
- DeepSeek, "Day 6: One More Thing, DeepSeek-V3/R1 Inference System Overview" (deepseek-ai/open-infra-index,
  202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md): H800; prefill EP32 /
  DP32 on 4 nodes, decode EP144 / DP144 on 18 nodes; 56.3% of input tokens hit the KV cache; the mean KV
  length per output token 4,989; matmuls and dispatch in FP8; dual micro-batch overlap. Its profile
  (deepseek-ai/profile-data README) states its own setups, and LMSYS derives per-node throughputs from it.

Each row is one step of the placement's cost model (sim/cost/parallel.py over the engine's roofline), per
node: 8 GPUs x the tokens one attention rank takes in a step / the step's seconds, without and with two-batch
overlap (`two_batch_overlap`). Both sources run DeepEP: normal kernels for prefill, low-latency kernels for
decode (`ep_all_to_all = "deepep_auto"`), FP8 dispatch and BF16 combine (`ep_dispatch_dtype = "fp8"`), and 32
redundant experts (`ep_redundant_experts = 32`: SGLang's `--ep-num-redundant-experts 32`, sgl-project/sglang
issue 6017; DeepSeek's 9 and 2 routed experts a GPU over 32 and 144 GPUs), which make EP72 and EP144
expressible (288 experts). `--old` prints the rows under the rule before these mechanisms (per-expert BF16
all-to-all over one link, no redundant experts, EP64 and EP128 in place of EP72 and EP144). `--deepep` sets
the all-to-all rules against DeepEP's published kernel latencies (deepseek-ai/DeepEP, docs/legacy.md).

    .venv/bin/python benchmarks/deepseek_published.py [--json] [--old | --deepep]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.catalog.gpu_formats import served_model
from sim.catalog.gpus import get_gpu
from sim.catalog.links import get_link
from sim.catalog.models import load_model
from sim.config.calibration import Calibration
from sim.cost.expert_parallel import all_to_all_links, dispatch_bytes_per_element
from sim.cost.parallel import ParallelCost, all_to_all_seconds
from sim.cost.placement import Placement, check_placement, rank_memory
from sim.cost.roofline import CostModel

MODEL = "deepseek-v3"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Setup:
    """One published figure and the step that reproduces it."""

    name: str
    source: float  # tokens/s per node, as published
    gpu: str
    placement: Placement
    new: int  # tokens per row in the step (a prompt's uncached tokens, or 1 for a decode)
    context: int  # cached tokens per row
    rows_per_rank: int
    counted: int  # tokens per row the figure counts (a prompt's whole length with its cache hits, or 1)
    note: str


def step_seconds(s: Setup, skew: float | None = None, redundant: int | None = None) -> float:
    """One step of `s` (optionally at another expert skew or redundant experts), the slowest rank's."""
    return breakdown(s, skew, redundant).seconds


def breakdown(s: Setup, skew: float | None = None, redundant: int | None = None) -> Any:
    """The step of `s` by part (sim/cost/parallel.py's StepBreakdown)."""
    spec = served_model(load_model(MODEL), get_gpu(s.gpu))
    p = s.placement if skew is None else Placement(**{**_fields(s.placement), "expert_skew": skew})
    if redundant is not None:
        p = Placement(**{**_fields(p), "ep_redundant_experts": redundant})
    check_placement(spec, p, s.name)
    g = get_gpu(s.gpu)
    rank_memory(spec, g, p, 0.9, None, None, 16, s.name)
    base = CostModel(spec, g, p.tp, None, None, Calibration.load())
    rows = s.rows_per_rank * p.dp
    new = np.full(rows, s.new, dtype=np.int64)
    ctx = np.full(rows, s.context, dtype=np.int64)
    return ParallelCost(base, spec, g, p).breakdown(new, ctx)


def _fields(p: Placement) -> dict[str, Any]:
    return {k: getattr(p, k) for k in p.__dataclass_fields__}


def per_node(s: Setup, skew: float | None = None, redundant: int | None = None) -> float:
    """Tokens/s per node the figure counts: the GPUs of a node, each with one rank's rows (an attention rank
    spans tp GPUs)."""
    per_gpu = s.rows_per_rank * s.counted / s.placement.tp / step_seconds(s, skew, redundant)
    return GPUS_PER_NODE * per_gpu


def kv_rows(s: Setup) -> int:
    """Sequences one attention rank's KV holds at the setup's length."""
    spec = served_model(load_model(MODEL), get_gpu(s.gpu))
    mem = rank_memory(spec, get_gpu(s.gpu), s.placement, 0.9, None, None, 16, s.name)
    return mem.kv_tokens_per_rank // (s.context + s.new)


HIT = 0.563  # DeepSeek: 342B of 608B input tokens hit the on-disk KV cache
DS_PROMPT = 4096  # assumed: the input length of DeepSeek's profile data, which LMSYS quotes
DS_NEW = round(DS_PROMPT * (1 - HIT))

# The sources' all-to-all: DeepEP (normal kernels for prefill, low-latency for decode), FP8 dispatch, 32
# redundant experts; H800's own NVLink for DeepSeek's rows.
DEEPEP = {"ep_all_to_all": "deepep_auto", "ep_dispatch_dtype": "fp8", "ep_redundant_experts": 32}
H800 = {**DEEPEP, "intra_node_link": "nvlink-4-h800"}


def _with(s: Setup, **change: Any) -> Setup:
    return Setup(**{**s.__dict__, **change})


def _ep(ep: int, **keys: Any) -> Placement:
    return Placement(1, 1, ep, ep, **keys)


# DeepSeek's profile (deepseek-ai/profile-data README: prefill EP32 TP1, 4K prompts, 16K tokens a GPU;
# decode EP128 TP1, 128 requests a GPU, 4K prompts; "an absolutely balanced MoE routing"), the throughputs
# per node as LMSYS derives them from it (its blog's "Profile Results" tables: 62,713 and 18,598).
PROFILE_SETUPS = [
    Setup("DeepSeek profile prefill, 4,096-token prompts", 62_713, "H800-SXM", _ep(32, **H800), 4096, 0, 4,
          4096, "EP32 DP32, 32 redundant; 4 prompts of 4,096 = 16,384 tokens per rank, none cached"),
    Setup("DeepSeek profile decode, KV 4,096", 18_598, "H800-SXM",
          _ep(128, **{**H800, "ep_redundant_experts": 0}), 1, 4096, 128, 1,
          "EP128 DP128 on 16 nodes, no redundant experts; 128 sequences per rank"),
]
SETUPS = [
    Setup("SGLang prefill, 2,000-token prompts", 52_300, "H100-SXM", _ep(32, **DEEPEP), 2000, 0, 8,
          2000, "EP32 DP32 on 4 nodes, 32 redundant experts; 8 prompts of 2,000 = 16,000 tokens per rank"),
    Setup("SGLang decode, KV 2,000", 22_300, "H100-SXM", _ep(72, **DEEPEP), 1, 2000, 256, 1,
          "EP72 DP72 on 9 nodes, 32 redundant experts; 256 sequences per rank"),
    Setup("DeepSeek prefill (cache hits counted)", 73_700, "H800-SXM", _ep(32, **H800), DS_NEW,
          DS_PROMPT - DS_NEW, 9, DS_PROMPT,
          f"EP32 DP32, 32 redundant; 9 prompts of {DS_PROMPT} per rank, {DS_PROMPT - DS_NEW} of each cached"),
    Setup("DeepSeek decode, KV 4,989", 14_800, "H800-SXM", _ep(144, **H800), 1, 4989, 128, 1,
          "EP144 DP144 on 18 nodes, 32 redundant; 128 sequences per rank (LMSYS's reading)"),
    *PROFILE_SETUPS,
]
# The same figures under the rule before DeepEP and EPLB (`--old`): EP64 and EP128 for EP72 and EP144.
OLD_SETUPS = [
    Setup("SGLang prefill, 2,000-token prompts", 52_300, "H100-SXM", Placement(1, 1, 32, 32), 2000, 0, 8,
          2000, "EP32 DP32 on 4 nodes; 8 prompts of 2,000 = 16,000 tokens per rank"),
    Setup("SGLang decode, KV 2,000", 22_300, "H100-SXM", Placement(1, 1, 64, 64), 1, 2000, 256, 1,
          "EP72 not expressible (256 experts): EP64 DP64 on 8 nodes; 256 sequences per rank"),
    Setup("DeepSeek prefill (cache hits counted)", 73_700, "H800-SXM", Placement(1, 1, 32, 32), DS_NEW,
          DS_PROMPT - DS_NEW, 9, DS_PROMPT,
          f"EP32 DP32; 9 prompts of {DS_PROMPT} per rank, {DS_PROMPT - DS_NEW} of each cached (56.3%)"),
    Setup("DeepSeek decode, KV 4,989", 14_800, "H800-SXM", Placement(1, 1, 128, 128), 1, 4989, 128, 1,
          "EP144 not expressible: EP128 DP128 on 16 nodes; 128 sequences per rank (LMSYS's reading)"),
    *(_with(x, placement=Placement(1, 1, x.placement.ep, x.placement.ep)) for x in PROFILE_SETUPS),
]
# The baseline of SGLang's EP gain, as the blog states it: "TP16 x 6 ... a TP size of 16 and DP attention",
# two nodes a group: attention data-parallel over 16 ranks, each at the sequences its own KV holds, and the
# experts TP-sharded over the 16 GPUs (each MoE layer gathers the group's tokens over InfiniBand and
# reduce-scatters them back), against the EP decode row above.
TP16 = Setup("SGLang TP16 baseline, decode", 0, "H100-SXM", Placement(1, 1, 1, 16), 1, 2000, 0, 1,
             "TP 16 experts with DP attention on two nodes")


def _tbo(s: Setup) -> Setup:
    return _with(s, placement=Placement(**{**_fields(s.placement), "two_batch_overlap": True}))


def rows(setups: list[Setup] | None = None) -> list[dict[str, Any]]:
    """One row per figure: the source's number, the simulator's without and with two-batch overlap."""
    setups = SETUPS if setups is None else setups
    old = setups is OLD_SETUPS
    out = []
    for s in setups:
        plain, tbo = per_node(s), per_node(_tbo(s))
        b = breakdown(s)
        out.append({
            "figure": s.name, "source": s.source, "sim": round(plain), "sim_tbo": round(tbo),
            "ratio": round(plain / s.source, 3), "ratio_tbo": round(tbo / s.source, 3), "setup": s.note,
            "step_ms": round(b.seconds * 1e3, 2), "attention_rank_ms": round(max(b.rank_s) * 1e3, 2),
            "dispatch_ms_per_layer": round(b.dispatch_s * 1e3, 4),
            "combine_ms_per_layer": round(b.combine_s * 1e3, 4),
        })  # fmt: skip
    ep = setups[1]
    tp = _with(TP16, rows_per_rank=kv_rows(TP16))
    gain, gain_tbo = per_node(ep) / per_node(tp), per_node(_tbo(ep)) / per_node(tp)
    out.append({
        "figure": "EP over TP16, decode output per node", "source": 5.2, "sim": round(gain, 2),
        "sim_tbo": round(gain_tbo, 2), "ratio": round(gain / 5.2, 3), "ratio_tbo": round(gain_tbo / 5.2, 3),
        "setup": f"TP16 experts with DP16 attention on two nodes, {tp.rows_per_rank} sequences of KV 2,000 a "
                 f"rank (all its KV holds); EP{ep.placement.ep} at 256 a rank",
    })  # fmt: skip
    skew = 1.0 if old else fitted_skew(setups[1])
    for s, published in ((setups[0], 1.49), (setups[1], EPLB_DECODE)):
        out.append(_eplb_row(s, published, old, skew))
    for s, low, high in ((setups[0], 1.27, 1.35), (setups[1], 1.255, 1.255)):
        gain = per_node(_tbo(s)) / per_node(s)
        out.append({
            "figure": f"two-batch overlap gain, {'prefill' if s.new > 1 else 'decode'}",
            "source": f"{low}-{high}" if low != high else high, "sim": round(gain, 3), "sim_tbo": "",
            "ratio": round(gain / high, 3), "ratio_tbo": "", "setup": s.note,
        })  # fmt: skip
    return out


def _eplb_gains(s: Setup, skew: float) -> tuple[float, float]:
    """EPLB's gain, plain and with TBO, under a Zipf(`skew`) gate: with the setup's redundant experts over
    none (EP72's decode row against EP64 without, the nearest placement 256 experts divide)."""
    ep64 = Placement(**{**_fields(s.placement), "ep": 64, "dp": 64})
    none = s if s.placement.ep == 32 else _with(s, placement=ep64)
    plain, tbo = (per_node(x, skew=skew) / per_node(y, skew=skew, redundant=0)
                  for x, y in ((s, none), (_tbo(s), _tbo(none))))  # fmt: skip
    return plain, tbo


EPLB_DECODE = 2.54  # SGLang's EPLB gain in decode: the figure the gate's exponent is fitted to


def fitted_skew(s: Setup, target: float = EPLB_DECODE) -> float:
    """The Zipf exponent at which EPLB's decode gain with TBO is `target` (the gain grows with it), by
    bisection: SGLang publishes no gate distribution, so one figure fixes it and the other checks it."""
    lo, hi = 0.0, 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _eplb_gains(s, mid)[1] < target else (lo, mid)
    return 0.5 * (lo + hi)


def _eplb_row(s: Setup, published: float, old: bool, skew: float = 1.0) -> dict[str, Any]:
    """EPLB's gain under a Zipf(`skew`) gate (`_eplb_gains`); the old rows: a balanced gate over Zipf(1.0)."""
    if old:
        gain, gain_tbo = (per_node(x) / per_node(x, skew=1.0) for x in (s, _tbo(s)))
        setup = "balanced gate over a Zipf(1.0) one (the exponent is not published)"
    else:
        gain, gain_tbo = _eplb_gains(s, skew)
        role = "fitted to this row's gain with TBO" if s.new == 1 else "the decode row's fit, checked here"
        setup = (f"Zipf({skew:.3f}) gate ({role}): EP{s.placement.ep} with 32 redundant experts over the "
                 "same placement with none (EP64 for EP72)")  # fmt: skip
    return {
        "figure": f"EPLB gain, {'prefill' if s.new > 1 else 'decode'}", "source": published,
        "sim": round(gain, 3), "sim_tbo": round(gain_tbo, 3), "ratio": round(gain / published, 3),
        "ratio_tbo": round(gain_tbo / published, 3), "setup": setup,
    }  # fmt: skip


# DeepEP's low-latency kernels on H800 with CX7 (deepseek-ai/DeepEP docs/legacy.md): 128 tokens a rank,
# hidden 7,168, top-8, FP8 dispatch, BF16 combine; (EP, dispatch us, combine us).
DEEPEP_LOW_LATENCY = [(16, 118, 195), (32, 155, 273), (64, 173, 314), (128, 192, 369), (256, 194, 360)]


def deepep_rows() -> list[dict[str, Any]]:
    """The low-latency rule's dispatch and combine at DeepEP's published setups, against its latencies."""
    spec = load_model(MODEL)
    nv, ib = get_link("nvlink-4-h800"), get_link("infiniband-ndr")
    out = []
    for ep, dispatch_us, combine_us in DEEPEP_LOW_LATENCY:
        sim = []
        for elem in (dispatch_bytes_per_element("fp8"), 2.0):
            nvl, inter = all_to_all_links(spec, "deepep_low_latency", 128, ep, GPUS_PER_NODE, elem)
            sim.append(max(all_to_all_seconds(nvl, nv), all_to_all_seconds(inter, ib)) * 1e6)
        out.append({
            "ep": ep, "dispatch_us": dispatch_us, "sim_dispatch_us": round(sim[0], 1),
            "dispatch_ratio": round(sim[0] / dispatch_us, 3), "combine_us": combine_us,
            "sim_combine_us": round(sim[1], 1), "combine_ratio": round(sim[1] / combine_us, 3),
        })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--old", action="store_true", help="the rows under the rule before DeepEP and EPLB")
    ap.add_argument("--deepep", action="store_true", help="DeepEP's low-latency kernel latencies")
    args = ap.parse_args()
    if args.deepep:
        ll = deepep_rows()
        if args.json:
            print(json.dumps(ll, indent=2))
            return
        print("| EP | dispatch (DeepEP) | sim | sim / DeepEP | combine (DeepEP) | sim | sim / DeepEP |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in ll:
            print(f"| {r['ep']} | {r['dispatch_us']} us | {r['sim_dispatch_us']} us | {r['dispatch_ratio']} "
                  f"| {r['combine_us']} us | {r['sim_combine_us']} us | {r['combine_ratio']} |")
        return
    table = rows(OLD_SETUPS if args.old else None)
    if args.json:
        print(json.dumps(table, indent=2))
        return
    print("| figure | source | sim | sim / source | sim, TBO | sim, TBO / source | setup in the simulator |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in table:
        src, sim, tbo = (f"{v:,}" if isinstance(v, (int, float)) else v
                         for v in (r["source"], r["sim"], r["sim_tbo"]))  # fmt: skip
        print(f"| {r['figure']} | {src} | {sim} | {r['ratio']} | {tbo} | {r['ratio_tbo']} | {r['setup']} |")


if __name__ == "__main__":
    main()

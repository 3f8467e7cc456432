"""SGLang's wide-EP DeepSeek-V3 steps on H100, side by side: LMSYS's published throughput, NVIDIA
aiconfigurator's estimate from SGLang's own measured modules, and the simulator's step model
(docs/parallelism.md, "Side by side with aiconfigurator's SGLang wide-EP estimate").

aiconfigurator 0.12.0 ships SGLang 0.5.10's wide-EP tables for the H100 SXM (the MLA module with
FlashAttention 3, DeepEP's grouped-GEMM MoE, DeepEP's normal and low-latency all-to-all, measured on one
node) and composes a step from them (`cli estimate --backend sglang`; its default gate a power law of
exponent 1.01, no EPLB, no two-batch overlap). Two of LMSYS's rows have its shapes: the prefill at 16,384
tokens a rank (8 prompts of 2,048) on EP32, and the decode at 256 sequences a rank of KV 2,000 on EP64 (its
tables have no EP72). The simulator's step is costed on the same placements without redundant experts or
two-batch overlap, as aiconfigurator's is, at a uniform gate (its power-law gate is its collector's, not a
Zipf law over experts that the simulator's `expert_skew` could take: at `expert_skew = 1.01` the simulator's
busiest EP32 rank's experts take 13.5 times the uniform gate's, and the step 27.7 s: the eight hottest
experts share one rank).

aiconfigurator is an optional extra, never a test dependency; it may live in a venv of its own:

    pip install aiconfigurator==0.12.0                       # or: pip install 'servesim[aiconfigurator]'
    PYTHONPATH=. .venv/bin/python benchmarks/aiconfigurator_wideep.py --aic-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepseek_published as dp  # noqa: E402  (the benchmark next to this one: its setups and step model)

from sim.catalog.models import load_model  # noqa: E402
from sim.cost.placement import Placement  # noqa: E402

SGLANG_DB = "0.5.10"  # the SGLang version of aiconfigurator's H100 wide-EP MLA and MoE tables
QUANT = {"gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block", "kvcache_quant_mode": "fp8",
         "fmha_quant_mode": "fp8_block", "attention_backend": "fa3"}  # fmt: skip
# (row, aiconfigurator mode, ISL, batch per rank, EP, LMSYS tokens/s per node, simulator setup)
ROWS = (
    ("prefill, 8 x 2,048 tokens a rank, EP32", "static_ctx", 2048, 8, 32, 52_300,
     dp.Setup("prefill", 52_300, "H100-SXM", Placement(1, 1, 32, 32, ep_all_to_all="deepep_auto",
              ep_dispatch_dtype="fp8"), 2048, 0, 8, 2048, "")),
    ("decode, 256 a rank at KV 2,000, EP64", "static_gen", 2000, 256, 64, 22_300,
     dp.Setup("decode", 22_300, "H100-SXM", Placement(1, 1, 64, 64, ep_all_to_all="deepep_auto",
              ep_dispatch_dtype="fp8"), 1, 2000, 256, 1, "")),
)  # fmt: skip
AIC_SNIPPET = """
import json, sys
from aiconfigurator.cli.api import cli_estimate
args = json.loads(sys.argv[1])
r = cli_estimate("deepseek-ai/DeepSeek-V3", "h100_sxm", backend_name="sglang", backend_version=args["db"],
                 mode=args["mode"], isl=args["isl"], osl=2, batch_size=args["batch"], tp_size=1,
                 attention_dp_size=args["ep"], moe_tp_size=1, moe_ep_size=args["ep"], **args["quant"])
s = r.summary
ops = s.get_context_latency_dict() if args["mode"] == "static_ctx" else s.get_generation_latency_dict()
ops = {k: float(v) for k, v in ops.items()}
print(json.dumps({"ttft": r.ttft, "tpot": r.tpot, "version": r.backend_version, "ops": ops}))
"""


def aiconfigurator_step(python: str, mode: str, isl: int, batch: int, ep: int) -> dict[str, Any]:
    """aiconfigurator's estimate of one static step (ms), with its per-op latencies, from `python`."""
    args = json.dumps({"db": SGLANG_DB, "mode": mode, "isl": isl, "batch": batch, "ep": ep, "quant": QUANT})
    env = {**os.environ, "AIC_ALLOW_UNLISTED_VERSIONS": "1"}  # 0.5.10 is outside the package's version slots
    out = subprocess.run([python, "-c", AIC_SNIPPET, args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"aiconfigurator failed ({python}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def grouped(ops: dict[str, float], phase: str) -> dict[str, float]:
    """aiconfigurator's per-op latencies of one phase (ms), grouped: the dispatch and combine, the routed
    experts, the MLA module, and the rest (projections outside MLA, norms, shared expert, embedding)."""
    comm = sum(v for k, v in ops.items() if k.endswith(("_moe_dispatch", "_moe_combine")))
    experts = ops.get(f"{phase}_moe", 0.0)
    mla = ops.get(f"{phase}_attention", 0.0)
    return {"all-to-all": comm, "routed experts": experts, "MLA": mla,
            "rest": sum(ops.values()) - comm - experts - mla}  # fmt: skip


def sim_step(setup: dp.Setup, skew: float) -> dict[str, float]:
    """The simulator's step (ms) by group: the attention rank's compute, its routed experts (per EP rank,
    the busiest), and dispatch plus combine over the MoE layers."""
    b = dp.breakdown(setup, skew=skew, redundant=0)
    layers = load_model(dp.MODEL).num_moe_layers
    experts = layers * max(b.expert_rank_s) if b.expert_rank_s else 0.0
    comm = layers * (b.dispatch_s + b.combine_s)
    return {"step": 1e3 * b.seconds, "all-to-all": 1e3 * comm, "routed experts (busiest rank)": 1e3 * experts,
            "skew": 1e3 * layers * b.skew_s}  # fmt: skip


def per_node(setup: dp.Setup, step_ms: float) -> float:
    return dp.GPUS_PER_NODE * setup.rows_per_rank * setup.counted / (step_ms / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aic-python", default=sys.executable, help="a Python with aiconfigurator==0.12.0")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    out = []
    for name, mode, isl, batch, ep, published, setup in ROWS:
        aic = aiconfigurator_step(args.aic_python, mode, isl, batch, ep)
        step = aic["ttft"] if mode == "static_ctx" else aic["tpot"]
        groups = grouped(aic["ops"] or {}, "context" if mode == "static_ctx" else "generation")
        uniform = sim_step(setup, 0.0)
        out.append({
            "row": name, "lmsys_tokens_per_node": published,
            "aiconfigurator_step_ms": round(step, 1),
            "aiconfigurator_tokens_per_node": round(per_node(setup, step)),
            "aiconfigurator_groups_ms": {k: round(v, 1) for k, v in groups.items()},
            "sim_uniform": {k: round(v, 1) for k, v in uniform.items()},
            "sim_uniform_tokens_per_node": round(per_node(setup, uniform["step"])),
            "aiconfigurator_sglang": aic["version"],
        })  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        "| row | LMSYS tok/s a node | aiconfigurator: step ms (tok/s a node) | its all-to-all / experts /"
        " MLA / rest ms | sim, uniform gate: step ms (tok/s a node) | sim: all-to-all / experts ms |"
    )
    print("|---|---:|---|---|---|---|")
    for r in out:
        g, u = r["aiconfigurator_groups_ms"], r["sim_uniform"]
        print(f"| {r['row']} | {r['lmsys_tokens_per_node']:,} | {r['aiconfigurator_step_ms']:,} "
              f"({r['aiconfigurator_tokens_per_node']:,}) | {g['all-to-all']:,} / {g['routed experts']:,} / "
              f"{g['MLA']:,} / {g['rest']:,} | {u['step']:,} ({r['sim_uniform_tokens_per_node']:,}) | "
              f"{u['all-to-all']:,} / {u['routed experts (busiest rank)']:,} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""Side by side with NVIDIA's aiconfigurator (vLLM backend) on three questions: the aggregated-versus-
disaggregated winner, output tokens/s per GPU at the SLO, and the parallelism chosen.

For each question aiconfigurator (`cli_default`, the Python form of `aiconfigurator cli default`) searches
aggregated and disaggregated vLLM deployments on a fixed GPU count and reports the best of each at its
SLO (mean TTFT and TPOT of one steady batch). `sim plan` is then asked for the cheapest configuration within
that many GPUs that meets the same SLO (90% of Poisson-arriving requests within both bounds, the planner's
goodput rule) at the request rate aiconfigurator reports; when none does, at 0.9, 0.8, ... of that rate,
until one does, so servesim's tokens/s per GPU at the SLO is the highest of those rates it holds. Then
one `sim run` of each of aiconfigurator's two configurations at its own rate, with step figures per group
of replicas (busy share, prefill share, prefill time per prompt, decode step, preemptions).

aiconfigurator is an optional extra, never a test dependency:

    pip install 'servesim[aiconfigurator]'      # or: pip install aiconfigurator==0.12.0
    PYTHONPATH=. python benchmarks/aiconfigurator_compare.py [--only llama70b-h100x16] [--jobs 1]
    # aiconfigurator in a venv of its own, servesim's `sim` from another:
    /tmp/aic-venv/bin/python benchmarks/aiconfigurator_compare.py --sim-python .venv/bin/python

The `sim plan` runs go to reports/aiconfigurator_compare/<question>-r<rate>/ and the `sim run`s to
<question>-<mode>-as-chosen/; a re-run reads back the plans' runs it finds there. Every command run is
printed on stderr; the table and a JSON of both tools' answers on stdout (the JSON also to --json).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "scenarios/plan-llama70b-chat.toml"
AIC_VERSION = "0.12.0"
RATE_FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


@dataclass(frozen=True)
class Question:
    """One serving question, as each tool names its model and GPU."""

    key: str
    aic_model: str  # aiconfigurator's bundled HF config
    aic_system: str
    sim_model: str  # sim/catalog/models
    gpu: str  # sim/catalog/gpus.toml
    total_gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    tps: str  # sim plan --tp
    horizon_s: float | None = None  # a longer run where requests last long (the scenario's 120 s otherwise)

    def sim_sets(self) -> list[str]:
        """`--set` overrides of the plan scenario for this question's model, lengths, SLO and horizon."""
        horizon = [] if self.horizon_s is None else [f"horizon.duration_s={float(self.horizon_s)!r}"]
        return [
            *horizon,
            f"model.name={self.sim_model}",
            f'workload.prompt={{kind="fixed",value={self.isl}}}',
            f'workload.output={{kind="fixed",value={self.osl}}}',
            f"slo.ttft_s={self.ttft_ms / 1000!r}",  # a float, as in the scenario (the run keys hash it)
            f"slo.tpot_s={self.tpot_ms / 1000!r}",
        ]


QUESTIONS = (
    Question("llama70b-h100x16", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "llama-3.1-70b-instruct",
             "H100-SXM", 16, 3000, 300, 2000, 40, "2,4,8"),
    Question("llama8b-a100x4", "meta-llama/Meta-Llama-3.1-8B", "a100_sxm", "llama-3.1-8b",
             "A100-80GB", 4, 2000, 200, 1000, 30, "1,2,4"),
    Question("llama70b-h200x8", "meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "llama-3.1-70b-instruct",
             "H200", 8, 1000, 1000, 2000, 50, "1,2,4,8", horizon_s=300),
)  # fmt: skip


def aic_command(q: Question) -> str:
    """The aiconfigurator command line equivalent to the `cli_default` call."""
    return (
        f"aiconfigurator cli default --model {q.aic_model} --total-gpus {q.total_gpus}"
        f" --system {q.aic_system} --backend vllm --isl {q.isl} --osl {q.osl}"
        f" --ttft {q.ttft_ms:g} --tpot {q.tpot_ms:g}"
    )


def _sim_label(mode: str, row: dict[str, Any], replicas: int, gpu: str) -> str:
    """The configuration as `sim plan` labels it (its rows in plan.parquet)."""
    if mode == "agg":
        return f"{replicas}x {gpu} TP{int(row['tp'])}"
    p, d = replicas * int(row["(p)workers"]), replicas * int(row["(d)workers"])
    ptp, dtp = int(row["(p)tp"]), int(row["(d)tp"])
    return f"{p}P+{d}D x {gpu} TP{ptp}" if ptp == dtp else f"{p}P x {gpu} TP{ptp} + {d}D x {gpu} TP{dtp}"


def _aic_row(mode: str, row: dict[str, Any], total_gpus: int, gpu: str) -> dict[str, Any]:
    """One mode's best configuration: its parallelism, request rate and tokens/s per GPU over the cluster."""
    replicas = total_gpus // int(row["num_total_gpus"])
    label = _sim_label(mode, row, replicas, gpu)
    if mode == "agg":
        shape = f"{replicas} x TP{int(row['tp'])} (batch {int(row['bs'])})"
    else:
        shape = (
            f"{replicas} x ({int(row['(p)workers'])}P TP{int(row['(p)tp'])} + "
            f"{int(row['(d)workers'])}D TP{int(row['(d)tp'])}, decode batch {int(row['(d)bs'])})"
        )
    dims = (
        {"replicas": replicas, "tp": int(row["tp"])}
        if mode == "agg"
        else {
            "prefill": replicas * int(row["(p)workers"]),
            "prefill_tp": int(row["(p)tp"]),
            "decode": replicas * int(row["(d)workers"]),
            "decode_tp": int(row["(d)tp"]),
        }  # fmt: skip
    )
    return {
        "parallelism": shape, "gpus_used": replicas * int(row["num_total_gpus"]), "sim_label": label,
        "shape": dims,
        "request_rate": round(float(row["request_rate"]) * replicas, 2),
        "tokens_per_s_per_gpu": round(float(row["tokens/s/gpu_cluster"]), 2),
        "ttft_ms": round(float(row["ttft"]), 1), "tpot_ms": round(float(row["tpot"]), 2),
        "perf_db": str(row["version"] if mode == "agg" else row["(d)version"]),
        "prefill_ms_per_prompt": None if mode == "agg" else round(1000 / float(row["(p)seq/s/worker"]), 1),
    }  # fmt: skip


def run_aiconfigurator(q: Question) -> dict[str, Any]:
    """aiconfigurator's best aggregated and disaggregated configurations for the question, and its winner."""
    try:
        import aiconfigurator
        from aiconfigurator.cli.api import cli_default
    except ImportError:
        sys.exit(
            "benchmarks/aiconfigurator_compare.py needs aiconfigurator, an optional extra: "
            f"pip install 'servesim[aiconfigurator]' (or pip install aiconfigurator=={AIC_VERSION})"
        )
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = cli_default(
            model_path=q.aic_model, total_gpus=q.total_gpus, system=q.aic_system, backend="vllm",
            isl=q.isl, osl=q.osl, ttft=q.ttft_ms, tpot=q.tpot_ms, top_n=5,
        )  # fmt: skip
    logging.disable(logging.NOTSET)
    best: dict[str, Any] = {}
    for mode, df in result.best_configs.items():
        if df is None or df.empty:
            best[mode] = None
            continue
        top = df.sort_values("tokens/s/gpu_cluster", ascending=False, kind="stable").iloc[0]
        best[mode] = _aic_row(mode, top.to_dict(), q.total_gpus, q.gpu)
    return {"version": aiconfigurator.__version__, "winner": result.chosen_exp, "best": best,
            "command": aic_command(q)}  # fmt: skip


def plan_command(q: Question, rate: float, jobs: int, out: Path) -> list[str]:
    """The `sim plan` command for the question at `rate`."""
    cmd = [
        "sim", "plan", SCENARIO, "--rate", f"{rate:.2f}", "--gpus", q.gpu, "--max-gpus", str(q.total_gpus),
        "--tp", q.tps, "--modes", "colocated,pd,hetero", "--jobs", str(jobs),
    ]  # fmt: skip
    for s in q.sim_sets():
        cmd += ["--set", s]
    return [*cmd, "--out", str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)]


def _quoted(cmd: list[str]) -> str:
    """The command as a shell line."""
    return shlex.join(cmd)


def run_sim_plan(q: Question, rate: float, jobs: int, reports: Path, python: str) -> dict[str, Any]:
    """`sim plan`'s answer at aiconfigurator's rate, else at the first lower fraction of it that it holds."""
    tried = []
    for frac in RATE_FRACTIONS:
        r = round(rate * frac, 2)
        out = reports / f"{q.key}-r{r:.2f}"
        cmd = plan_command(q, r, jobs, out)
        print(f"$ {_quoted(cmd)}", file=sys.stderr)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([python, "-m", *cmd], cwd=ROOT, env=env,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"sim plan failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        plan = json.loads((out / "plan.json").read_text())
        best = plan["best"]
        cmp = plan["aggregated_vs_disaggregated"]
        tried.append({"rate": r, "answer": None if best is None else best["config"], "command": _quoted(cmd),
                      "simulated": plan["simulated"], "out": str(out)})  # fmt: skip
        if best is not None:
            row = next(c for c in plan["candidates"] if c["config"] == best["config"])
            return {
                "rate": r, "config": best["config"], "gpus": best["gpus"],
                "mode": "disagg" if best["mode"] == "pd" else "agg",
                "tokens_per_s_per_gpu": round(r * q.osl / best["gpus"], 2),
                "verdict": row["verdict"], "interval": [row["ci_low"], row["ci_high"]],
                "cheapest": cmp["cheapest"], "equal_gpus": cmp["equal_gpus"], "tried": tried,
            }  # fmt: skip
    return {"rate": None, "config": None, "tried": tried}


def choice_sets(q: Question, mode: str, b: dict[str, Any]) -> list[str]:
    """`--set` overrides that turn the plan scenario into aiconfigurator's configuration at its rate."""
    sets = [*q.sim_sets(), f"workload.arrival.rate={b['request_rate']!r}", f'model.gpu="{q.gpu}"']
    s = b["shape"]
    if mode == "agg":
        return [*sets, f"model.tp={s['tp']}", f"cluster.groups=[{{count={s['replicas']}}}]"]
    groups = (
        f'{{name="prefill",role="prefill",count={s["prefill"]},gpu="{q.gpu}",tp={s["prefill_tp"]}}},'
        f'{{name="decode",role="decode",count={s["decode"]},gpu="{q.gpu}",tp={s["decode_tp"]}}}'
    )
    return [
        *sets,
        f"model.tp={s['prefill_tp']}",
        f"cluster.groups=[{groups}]",
        'cluster.link="infiniband-ndr"',
    ]


def step_figures(path: Path, isl: int, horizon: float) -> dict[str, Any]:
    """Per group of replicas (prefill, decode, or the colocated g0), past the first quarter of the run:
    the busy share of replica time, the share of busy time in steps holding prefill tokens (on a decode
    replica: the recomputation of preempted sequences), the prefill time per prompt, the median
    decode-only step and its mean batch, and the preemptions."""
    import pandas as pd  # an aiconfigurator dependency

    df = pd.read_parquet(path)
    df = df[df["start"] > horizon / 4]
    out: dict[str, Any] = {}
    for group, g in df.groupby(df["replica"].str.rsplit("-", n=1).str[0], sort=True):
        pre, dec = g[g["prefill_tokens"] > 0], g[g["prefill_tokens"] == 0]
        prompts = pre["prefill_tokens"].sum() / isl
        busy = float(g["duration"].sum()) / (0.75 * horizon * g["replica"].nunique())
        out[str(group)] = {
            "busy": round(busy, 3),
            "prefill_share": round(float(pre["duration"].sum() / g["duration"].sum()), 3),
            "prefill_ms_per_prompt": round(1000 * float(pre["duration"].sum()) / prompts, 1)
            if prompts
            else None,
            "decode_step_ms_p50": round(1000 * float(dec["duration"].median()), 2) if len(dec) else None,
            "decode_batch_mean": round(float(dec["batch_size"].mean()), 1) if len(dec) else None,
            "preempted": int(g["preempted"].sum()),
        }
    return out


def simulate_choice(q: Question, mode: str, b: dict[str, Any], python: str, reports: Path) -> dict[str, Any]:
    """One `sim run` (the scenario's seed) of aiconfigurator's configuration at aiconfigurator's rate."""
    out = reports / f"{q.key}-{mode}-as-chosen"
    cmd = ["sim", "run", SCENARIO]
    for x in choice_sets(q, mode, b):
        cmd += ["--set", x]
    cmd += ["--out", str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)]
    print(f"$ {_quoted(cmd)}", file=sys.stderr)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([python, "-m", *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sim run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "vllm" / "summary.json").read_text())
    lat = summary["latency"]
    steps = step_figures(out / "vllm" / "steps.parquet", q.isl, float(summary["horizon_s"]))
    return {
        "config": b["sim_label"], "rate": b["request_rate"], "command": _quoted(cmd),
        "overloaded": summary["overloaded"], "slo_attainment": round(summary["slo_attainment"], 3),
        "ttft_p50_s": round(lat["ttft"]["p50"], 3), "ttft_p90_s": round(lat["ttft"]["p90"], 3),
        "tpot_p50_ms": round(1000 * lat["tpot"]["p50"], 1),
        "tpot_p90_ms": round(1000 * lat["tpot"]["p90"], 1),
        "output_tokens_per_s": round(summary["throughput"]["output_tokens_per_s"], 1), "steps": steps,
    }  # fmt: skip


def _as_chosen_line(mode: str, c: dict[str, Any]) -> str:
    """servesim's figures for one of aiconfigurator's choices, as a line."""
    return (
        f"  sim run of aiconfigurator's {mode} choice ({c['config']}) at {c['rate']:.2f} req/s: "
        f"{'overloaded' if c['overloaded'] else 'not overloaded'}, SLO attainment {c['slo_attainment']:.2f}, "
        f"TTFT p50/p90 {c['ttft_p50_s']:.2f}/{c['ttft_p90_s']:.2f} s, "
        f"TPOT p50/p90 {c['tpot_p50_ms']:.1f}/{c['tpot_p90_ms']:.1f} ms, "
        f"{c['output_tokens_per_s']:.0f} output tokens/s; "
        + "; ".join(
            f"{g}: busy {f['busy']:.2f}, prefill share {f['prefill_share']:.2f}, "
            f"{f['prefill_ms_per_prompt']} ms per prompt, "
            f"decode step p50 {f['decode_step_ms_p50']} ms at mean batch {f['decode_batch_mean']}, "
            f"{f['preempted']} preempted"
            for g, f in c["steps"].items()
        )
    )


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, one block of lines per question."""
    lines = []
    for r in rows:
        q, aic, sim = r["question"], r["aiconfigurator"], r["servesim"]
        lines.append(
            f"{q['key']}: {q['sim_model']} on {q['total_gpus']} x {q['gpu']}, "
            f"ISL {q['isl']}, OSL {q['osl']}, TTFT <= {q['ttft_ms']:g} ms, TPOT <= {q['tpot_ms']:g} ms"
        )
        for mode in ("agg", "disagg"):
            b = aic["best"].get(mode)
            if b is not None:
                lines.append(
                    f"  aiconfigurator {mode:6s}: {b['parallelism']}, {b['request_rate']} req/s, "
                    f"{b['tokens_per_s_per_gpu']} tokens/s/GPU, "
                    f"TTFT {b['ttft_ms']} ms, TPOT {b['tpot_ms']} ms"
                    + (
                        ""
                        if b["prefill_ms_per_prompt"] is None
                        else f", {b['prefill_ms_per_prompt']} ms per prompt"
                    )
                )
        lines.append(f"  aiconfigurator winner: {aic['winner']}")
        lines += [_as_chosen_line(mode, c) for mode, c in sim["as_chosen"].items()]
        for t in sim["tried"]:
            answer = t["answer"] or "nothing within the GPUs"
            lines.append(f"  sim plan at {t['rate']:.2f} req/s: {answer} ({t['simulated']} simulated)")
        if sim["config"] is not None:
            lines.append(
                f"  servesim winner: {sim['mode']} ({sim['config']}, {sim['gpus']} GPUs), "
                f"{sim['tokens_per_s_per_gpu']} tokens/s/GPU at {sim['rate']:.2f} req/s"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="question key (repeatable)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--reports", type=Path, default=ROOT / "reports" / "aiconfigurator_compare")
    ap.add_argument(
        "--sim-python", default=sys.executable, help="the Python that runs `sim plan` (default: this one)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the answers here")
    args = ap.parse_args()
    keys = {q.key for q in QUESTIONS}
    if set(args.only) - keys:
        sys.exit(f"--only: unknown question {sorted(set(args.only) - keys)}; expected one of {sorted(keys)}")
    rows = []
    for q in QUESTIONS:
        if args.only and q.key not in args.only:
            continue
        aic = run_aiconfigurator(q)
        winner = aic["best"][aic["winner"]]
        sim = run_sim_plan(q, winner["request_rate"], args.jobs, args.reports, args.sim_python)
        sim["as_chosen"] = {
            m: simulate_choice(q, m, b, args.sim_python, args.reports) for m, b in aic["best"].items() if b
        }
        rows.append({"question": asdict(q), "aiconfigurator": aic, "servesim": sim})
    text = json.dumps(rows, indent=2, sort_keys=True)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)
    print(table(rows))


if __name__ == "__main__":
    main()

"""Brute force against `sim plan`: the cheapest configuration of the same grid that meets the SLO on every
one of `--seeds` independent seeds, with nothing pruned but what does not fit in memory, and the planner's
answer beside it. The planner's answer must cost no more.

Configurations are run cheapest first (the order does not prune: every configuration cheaper than the first
one found meeting the SLO on every seed is run, and each of its cost). One seed's run meets the SLO by the
planner's own single-run rule (`sim.studies.plan.meets`, the judged requests of `plan_verdict`), on
`--duration` second runs (default: the scenario's horizon).

    .venv/bin/python benchmarks/plan_brute_force.py scenarios/plan-llama70b-chat.toml --rate 20 \\
        --gpus A100-80GB,H100-SXM,L40S --max-gpus 32 --rule p99 --seeds 5 --duration 600
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim.config.scenario import load_scenario, validate_scenario
from sim.studies import plan, plan_options, plan_space
from sim.studies.plan_verdict import replication_seed
from sim.studies.points import apply_rate


def brute_force(
    scenario_path: Path, rate: float, gpus: list[str], tps: list[int], max_gpus: int, modes: list[str],
    rule: str, attainment: float, seeds: int, duration: float | None, sets: list[str],
) -> dict[str, Any] | None:  # fmt: skip
    """The cheapest configuration meeting the SLO on every seed, with the cost level's runs, or None."""
    base = load_scenario(scenario_path, sets)
    raw = apply_rate(base.raw, base, rate, str(scenario_path))
    scenario = validate_scenario(raw, str(scenario_path))
    policy = next(iter(scenario.policies))
    cands, total, unfit = plan_space.candidates(
        scenario, policy, rate, scenario_path.parent, gpus, tps, {}, max_gpus, modes, theory=False
    )
    print(f"grid {total}: {unfit} do not fit, {len(cands)} to run cheapest first", file=sys.stderr)
    found: dict[str, Any] | None = None
    for c in cands:
        if found is not None and c.cost > found["cost_per_hour"]:
            break
        overrides = c.overrides(scenario, policy)
        if duration is not None:
            overrides["horizon.duration_s"] = duration
        ok = True
        for k in range(seeds):
            seed = replication_seed(scenario.seed, k)
            extra = {} if k == 0 else {"seed": seed}
            task = plan.PlanTask(
                raw, str(scenario_path), str(scenario_path.parent), policy, {**overrides, **extra}
            )
            if not plan.meets(plan.evaluate(task), rate, attainment, rule, scenario.slo):
                ok = False
                break
        print(f"{c.label()}: ${c.cost:.2f}/hour {'meets on every seed' if ok else 'misses'}", file=sys.stderr)
        if ok and found is None:
            found = {"config": c.label(), "cost_per_hour": c.cost, "gpus": c.gpus}
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--gpus", default=None)
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--max-gpus", type=int, default=16)
    ap.add_argument("--modes", default="colocated,pd")
    ap.add_argument("--rule", default="goodput")
    ap.add_argument("--attainment", type=float, default=0.9)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--skip-plan", action="store_true", help="only the brute force")
    args = ap.parse_args()
    gpus, tps, _, modes = plan_options.grid_options(args.gpus, args.tp, "", "", args.modes)
    gpus = gpus or [load_scenario(args.scenario, args.sets).model.gpu]
    found = brute_force(
        args.scenario, args.rate, gpus, tps, args.max_gpus, modes, args.rule, args.attainment, args.seeds,
        args.duration, args.sets,
    )  # fmt: skip
    out: dict[str, Any] = {"brute_force": found}
    if not args.skip_plan:
        sets = [*args.sets, *([f"horizon.duration_s={args.duration}"] if args.duration else [])]
        result = plan.search(args.scenario, sets, args.rate, gpus, args.max_gpus, 1, None, tps, None, modes,
                             args.attainment, 0, args.rule)  # fmt: skip
        best = result.best
        out["plan"] = (
            None if best is None else {"config": best["config"], "cost_per_hour": best["cost_per_hour"]}
        )
        out["plan_no_costlier"] = found is None or (
            best is not None and best["cost_per_hour"] <= found["cost_per_hour"] + 1e-9
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

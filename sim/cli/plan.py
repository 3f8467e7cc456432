"""`sim plan`: the cheapest fleet that meets the SLO at a rate."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app
from sim.report.options import out_option


@app.command("plan")
def plan(
    scenario: Path = typer.Argument(..., help="Scenario TOML file (its workload, SLO and policy)."),
    rate: float = typer.Option(..., "--rate", min=1e-6, max=1e6, help="Requests per second to serve."),
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPU types, e.g. A100-80GB,H100-SXM (default: model.gpu)."
    ),
    max_gpus: int = typer.Option(16, "--max-gpus", min=1, max=4096, help="Most GPUs in a configuration."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=1024, help="Parallel runs (1: in-process)."),
    executor: str = typer.Option("process", "--executor", help="process or dask."),
    address: str | None = typer.Option(None, "--address", help="Dask scheduler, tcp://HOST:PORT."),
    policy: str | None = typer.Option(None, "--policy", help="The policy to configure (default: the first)."),
    tp: str = typer.Option("1,2,4,8", "--tp", help="TP degrees to try."),
    max_num_seqs: str = typer.Option(
        "", "--max-num-seqs", help="Values to try, e.g. 64,256 (default: the policy's)."
    ),
    max_num_batched_tokens: str = typer.Option("", "--max-num-batched-tokens", help="Values to try."),
    weight_dtypes: str = typer.Option(
        "", "--weight-dtypes", help="Weight formats to try, e.g. bf16,fp8,int4 (default: the scenario's)."
    ),
    kv_dtypes: str = typer.Option("", "--kv-dtypes", help="KV-cache formats to try, e.g. bf16,fp8."),
    chunked_prefill: str = typer.Option(
        "", "--chunked-prefill", help="on, off or on,off (default: the policy's)."
    ),
    routers: str = typer.Option(
        "",
        "--routers",
        help="Routers to try, e.g. least_outstanding,power_of_two, or all (default: the scenario's).",
    ),
    pp: str = typer.Option("1", "--pp", help="Pipeline-parallel degrees to try, e.g. 1,2,4."),
    ep_dp: str = typer.Option(
        "",
        "--ep-dp",
        help="MoE: data-parallel attention sizes to try with expert parallelism (ep = tp x dp), e.g. 2,4.",
    ),
    nodes: int = typer.Option(1, "--nodes", min=1, max=512, help="Most nodes one replica spans."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=72, help="GPUs in a node."),
    modes: str = typer.Option(
        "colocated,pd",
        "--modes",
        help="colocated, pd (prefill/decode split), hetero (a split with a GPU and TP per role).",
    ),
    attainment: float = typer.Option(
        0.9, "--attainment", min=0.01, max=1.0, help="Goodput share of the rate."
    ),
    explore: int = typer.Option(
        0, "--explore", min=0, max=1000, help="Configurations to run past the answer."
    ),
    rule: str = typer.Option("goodput", "--rule", help="goodput (share of the rate within the SLO) or p99."),
    replications: int = typer.Option(
        3, "--replications", min=1, max=100, help="Seeds per configuration (its verdict's interval)."
    ),
    max_replications: int = typer.Option(
        9, "--max-replications", min=1, max=100, help="Most seeds for one too close to call."
    ),
    tail_samples: int = typer.Option(
        10, "--tail-samples", min=1, max=10000, help="Judged requests past the judged quantile per run."
    ),
    max_horizon: float = typer.Option(
        600.0, "--max-horizon", min=1.0, max=1e6, help="Horizon (s) a boundary configuration is settled on."
    ),
    settle_seeds: int = typer.Option(
        5, "--settle-seeds", min=0, max=100, help="Seeds at --max-horizon, each to pass (0: none)."
    ),
    rate_steps: int = typer.Option(
        0,
        "--rate-steps",
        min=0,
        max=20,
        help="Verdicts per bisection for the highest rate each answer sustains (0: off).",
    ),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set horizon.duration_s=120"),
    force: bool = typer.Option(
        False,
        "--force",
        help="Run again the finished runs kept in <out>/runs (a re-run of a killed plan reads them back).",
    ),
    out: Path | None = out_option("Output folder (default: reports/<scenario>/plan)."),
) -> None:
    """The cheapest fleet (GPU, TP, placement, knobs, replicas; colocated or prefill/decode) within the SLO
    at a rate."""
    from rich.console import Console

    from sim.config.scenario import load_scenario
    from sim.io.outputs import exit_on_terminate, path_component
    from sim.report.plan import print_plan, write_plan
    from sim.studies.plan import search
    from sim.studies.plan_options import grid_options, placement_options

    gpu_list, tps, knobs, mode_list = grid_options(
        gpus,
        tp,
        max_num_seqs,
        max_num_batched_tokens,
        modes,
        weight_dtypes,
        kv_dtypes,
        chunked_prefill,
        routers,
    )
    axes = placement_options(pp, ep_dp, nodes, gpus_per_node)
    sc_name = path_component(load_scenario(scenario, set_).name)
    out_dir = out or Path("reports") / sc_name / "plan"
    say = Console(stderr=True).print
    with exit_on_terminate():
        result = search(
            scenario, set_, rate, gpu_list, max_gpus, jobs, policy, tps, knobs, mode_list, attainment,
            explore, rule, replications, max_replications, tail_samples, max_horizon, executor, address,
            out_dir / "runs", force, lambda text: say(text, markup=False), settle_seeds,
            rate_steps, axes,
        )  # fmt: skip
    say(f"{result.ran} runs run, {result.resumed} read back from {out_dir / 'runs'}", markup=False)
    write_plan(result, scenario, out_dir)
    print_plan(result, out_dir)

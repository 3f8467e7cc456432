"""The `sim` command line. Each command is a thin wrapper over a module that does the work."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import typer

import sim
from sim.io.errors import SimError
from sim.io.limits import (
    MAX_BLOCK_SIZE,
    MAX_COUNT,
    MAX_KV_BLOCKS,
    MAX_TOKENS,
    RUN_MAX_REQUESTS,
    RUN_MAX_TOKENS,
)
from sim.io.paths import out_file_problem, out_folder_problem, shown
from sim.report.options import GuardedTyper, nonempty_path, out_folder, out_option, print_error

FORCE_HELP = (
    f"Run even when the estimated size exceeds {RUN_MAX_REQUESTS:,} requests or {RUN_MAX_TOKENS:,} tokens."
)


app = GuardedTyper(
    name="sim",
    help="servesim: simulate LLM inference serving (roofline cost model, batching policies, paged KV).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"servesim {sim.__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """servesim: simulate LLM inference serving (roofline cost model, batching policies, paged KV)."""


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `sim` console command and `python -m sim`.

    Bad input of any kind (a `SimError` from a command, an unknown option, a value out of range) prints
    `error: ...` and exits with code 2, as does a full disk; Ctrl-C exits with 130.
    """
    try:
        code = app(args=list(argv) if argv is not None else None, standalone_mode=False)
    except typer.TyperException as exc:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
        else:
            print_error(exc.format_message() if hasattr(exc, "format_message") else str(exc))
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        code = 130
    except Exception as exc:  # a full disk wherever a command writes is the user's to fix, not a traceback
        from sim.io.outputs import disk_full_reason

        if (reason := disk_full_reason(exc)) is None:
            raise
        print_error(f"cannot write: the disk is full ({reason}); free some space and run again")
        code = 2
    sys.exit(code if isinstance(code, int) else 0)


@app.command("replay-steps")
def replay_steps(
    trace: Path = typer.Argument(..., help="Trace: id, arrival_step, prompt_len, max_tokens, prefix_*, n."),
    out: Path | None = out_option("Write the steps as JSONL here.", out_file_problem),
    compare: Path | None = typer.Option(None, "--compare", help="Expected steps (.jsonl[.gz]) to compare."),
    block_size: int | None = typer.Option(None, "--block-size", min=1, max=MAX_BLOCK_SIZE),
    num_blocks: int | None = typer.Option(None, "--num-blocks", min=2, max=MAX_KV_BLOCKS),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1, max=MAX_COUNT),
    max_num_batched_tokens: int | None = typer.Option(
        None, "--max-num-batched-tokens", min=1, max=MAX_TOKENS
    ),
    max_model_len: int | None = typer.Option(None, "--max-model-len", min=2, max=MAX_TOKENS),
    prefix_caching: bool | None = typer.Option(None, "--prefix-caching/--no-prefix-caching"),
    chunked_prefill: bool | None = typer.Option(None, "--chunked-prefill/--no-chunked-prefill"),
    long_prefill_token_threshold: int | None = typer.Option(
        None, "--long-prefill-token-threshold", min=0, max=MAX_TOKENS
    ),
    watermark: float | None = typer.Option(
        None, "--watermark", min=0.0, max=1.0, help="Fraction of KV blocks kept free."
    ),
) -> None:
    """Replay a trace through the vllm scheduler in step time; optionally compare with a vLLM log.

    Settings not given come from EXPECTED's config line (with --compare), else from the oracle defaults.
    """
    from sim.studies import replay

    overrides = replay.overrides(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
        watermark=watermark,
    )
    report, code = replay.run(trace, out, compare, overrides)
    typer.echo(report)
    raise typer.Exit(code)


@app.command("run")
def run(
    scenario: Path = typer.Argument(..., help="Scenario TOML file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set workload.arrival.rate=4"),
    policy: list[str] = typer.Option([], "--policy", help="Run only these policies (default: all)."),
    out: Path | None = out_option("Output folder (default: reports/<scenario>)."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Simulate each policy of a scenario; write Parquet records, summary.json and manifest.json; print a
    comparison."""
    from sim.config.scenario import load_scenario
    from sim.io.outputs import exit_on_terminate, path_component
    from sim.io.progress import Stopwatch, run_progress
    from sim.records.summary import latency_counts
    from sim.report import console
    from sim.report.console import note_mixed_runs
    from sim.studies.run import run_to_folder
    from sim.studies.run_size import check_run_size

    sc = load_scenario(scenario, set_)
    names = policy or list(sc.policies)
    for name in names:
        if name not in sc.policies:
            raise SimError(f"{scenario}: no policy {name!r} (have: {', '.join(sc.policies)})")
    out_dir = out or Path("reports") / path_component(sc.name)
    if (why := out_folder_problem(out_dir)) is not None:
        raise SimError(f"output folder {shown(out_dir)}: {why}")
    check_run_size(sc, scenario.parent, str(scenario), force)
    summaries, counts, manifest = [], [], None
    for name in names:
        watch = Stopwatch()
        progress = run_progress(name, sc.horizon.duration_s, sc.horizon.max_requests)
        with exit_on_terminate(), progress as hook:
            result = run_to_folder(sc, name, out_dir, scenario.parent, source=str(scenario), progress=hook)
        typer.echo(console.run_line(result.summary, watch))
        summaries.append(result.summary)
        counts.append(latency_counts(result.requests))
        manifest = result.manifest
    console.print_comparison(sc, summaries, out_dir, counts)
    if manifest is not None:
        note_mixed_runs(out_dir, manifest, sc)


@app.command("schema")
def schema() -> None:
    """Print the JSON schema of scenario files (with each policy's knobs)."""
    import json

    from sim.config.scenario import schema as scenario_schema

    typer.echo(json.dumps(scenario_schema(), indent=2))


@app.command("capacity")
def capacity(
    models: list[str] = typer.Argument(..., help="Model: catalog name, HF id or config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. A100-80GB, H100."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, max=64, help="Pipeline-parallel stages."),
    ep: int = typer.Option(1, "--ep", min=1, max=1024, help="Expert-parallel ranks (1 or tp x dp)."),
    dp: int = typer.Option(1, "--dp", min=1, max=1024, help="Data-parallel attention ranks."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=72, help="GPUs per node."),
    expert_skew: float = typer.Option(
        0.0, "--expert-skew", min=0.0, max=4.0, help="Zipf exponent of the gate."
    ),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", min=0.0, max=1.0),
    weight_dtype: str | None = typer.Option(None, "--weight-dtype", help="fp32 bf16 fp16 fp8 int8 int4"),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="KV-cache dtype (default: model dtype)."),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", min=1, max=MAX_TOKENS, help="Default: the model's."
    ),
    typical_len: int = typer.Option(
        1024, "--typical-len", min=1, max=MAX_TOKENS, help="Typical prompt + output tokens."
    ),
    compare: bool = typer.Option(False, "--compare", help="Several models side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    draft_model: str | None = typer.Option(None, "--draft-model", help="Speculative draft model beside it."),
    draft_tp: int | None = typer.Option(None, "--draft-tp", min=1, max=64, help="Draft's TP (default --tp)."),
    max_loras: int = typer.Option(0, "--max-loras", min=0, max=4096, help="LoRA GPU slots taken from KV."),
    max_lora_rank: int = typer.Option(16, "--max-lora-rank", min=1, max=512, help="Rank of the LoRA slots."),
    weight_group_size: int | None = typer.Option(
        None,
        "--weight-group-size",
        min=0,
        max=1024,
        help="int4/int8 weights per 16-bit scale (0: per channel).",
    ),
    quantisation: bool = typer.Option(
        False, "--quantisation", help="One model under each weight and KV-cache format, side by side."
    ),
) -> None:
    """KV-cache capacity: weights, reserve, KV blocks and the sequences that fit, with the arithmetic."""
    from sim.cost.parallel import Placement
    from sim.report.capacity import print_capacity

    placement = Placement(tp, pp, ep, dp, None, gpus_per_node, expert_skew)
    if placement.beyond_tp:  # memory per GPU of the placement (sim/report/parallel.py)
        from sim.report.parallel import parallel_capacity

        if len(models) > 1:
            raise SimError("--pp, --ep and --dp take one model")
        parallel_capacity(models[0], gpu, placement, gpu_memory_utilization, weight_dtype, kv_dtype, as_json)
        return

    print_capacity(
        models, gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_model_len, typical_len, compare,
        as_json, draft_model, draft_tp, max_loras, max_lora_rank, weight_group_size, quantisation,
    )  # fmt: skip


@app.command("sweep")
def sweep(
    scenario: Path = typer.Argument(..., help="Scenario TOML file with a \\[sweep] table."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set sweep.replications=1"),
    jobs: int = typer.Option(2, "--jobs", min=1, max=1024, help="Parallel runs (1: in-process)."),
    executor: str = typer.Option("process", "--executor", help="process or dask."),
    address: str | None = typer.Option(None, "--address", help="Dask scheduler, tcp://HOST:PORT."),
    force: bool = typer.Option(
        False, "--force", help="Redo points whose files exist; run points over the size limit."
    ),
    find_capacity: bool = typer.Option(False, "--find-capacity", help="Bisect the capacity under \\[slo]."),
    out: Path | None = out_option("Output folder (default: reports/<scenario>)."),
) -> None:
    """Run the scenario's sweep table (rates x policies x params x replications); aggregate with CIs."""
    from sim.io.outputs import exit_on_terminate
    from sim.report.console import print_sweep
    from sim.studies.run_size import check_sweep_size
    from sim.studies.sweep import run_sweep

    check_sweep_size(scenario, set_, force)
    with exit_on_terminate():
        result = run_sweep(scenario, set_, jobs, executor, address, force, find_capacity, out)
    print_sweep(result)


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
        600.0, "--max-horizon", min=1.0, max=1e6, help="Longest run (s) for seeds split on overload."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set horizon.duration_s=120"),
    force: bool = typer.Option(
        False,
        "--force",
        help="Run again the finished runs kept in <out>/runs (a re-run of a killed plan reads them back).",
    ),
    out: Path | None = out_option("Output folder (default: reports/<scenario>/plan)."),
) -> None:
    """The cheapest fleet (GPU, TP, knobs, replicas; colocated or prefill/decode) within the SLO at a rate."""
    from rich.console import Console

    from sim.config.scenario import load_scenario
    from sim.io.outputs import exit_on_terminate, path_component
    from sim.report.plan import print_plan, write_plan
    from sim.studies.plan import search
    from sim.studies.plan_space import grid_options

    gpu_list, tps, knobs, mode_list = grid_options(
        gpus, tp, max_num_seqs, max_num_batched_tokens, modes, weight_dtypes, kv_dtypes, chunked_prefill
    )
    sc_name = path_component(load_scenario(scenario, set_).name)
    out_dir = out or Path("reports") / sc_name / "plan"
    say = Console(stderr=True).print
    with exit_on_terminate():
        result = search(
            scenario, set_, rate, gpu_list, max_gpus, jobs, policy, tps, knobs, mode_list, attainment,
            explore, rule, replications, max_replications, tail_samples, max_horizon, executor, address,
            out_dir / "runs", force, lambda text: say(text, markup=False),
        )  # fmt: skip
    say(f"{result.ran} runs run, {result.resumed} read back from {out_dir / 'runs'}", markup=False)
    write_plan(result, scenario, out_dir)
    print_plan(result, out_dir)


@app.command("validate")
def validate(
    target: str = typer.Argument(..., help="What to validate against: ground-truth."),
    csv: Path | None = typer.Argument(None, help="Ground-truth CSV (default: the shipped calibration set)."),
    out: Path | None = out_option("Write fidelity.csv and fidelity.html here."),
    jobs: int = typer.Option(
        2, "--jobs", min=1, max=1024, help="Rows simulated in parallel (1: in-process)."
    ),
    calibration: Path | None = typer.Option(None, "--calibration", help="A \\[calibration] TOML file."),
    scale: float = typer.Option(
        1.0, "--scale", min=0.001, max=100.0, help="Shorten every arrival stage by this factor."
    ),
    row: list[str] = typer.Option([], "--row", help="Only rows whose exp_key contains this."),
) -> None:
    """Simulate measured vLLM experiments and report predicted vs measured latency (see docs/fidelity.md)."""
    from sim.report.fidelity import run_ground_truth

    if target != "ground-truth":
        raise SimError(f"validate: unknown target {target!r} (ground-truth)")
    run_ground_truth(csv, out, jobs, calibration, scale, row)


@app.command("papers")
def papers(
    folder: Path = typer.Argument(Path("scenarios/papers"), help="Folder of *.paper.toml comparisons."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=1024, help="Parallel runs (1: in-process)."),
    quick: bool = typer.Option(False, "--quick", help="Reduced form: shorter runs, tolerances doubled."),
    out: Path | None = out_option("Output folder (default: reports/papers)."),
) -> None:
    """Reproduce the published comparisons: per cell the paper's figure, the simulator's, the ratio, the
    tolerance, and a page (OUT/index.html) of the simulated curves over the published points; exits 1 when a
    cell misses without a stated reason (docs/papers.md)."""
    from sim.io.outputs import exit_on_terminate
    from sim.report.papers import print_papers
    from sim.report.papers_page import write_papers_page
    from sim.studies.papers import run_papers, unexpected

    out = out or Path("reports/papers")
    with exit_on_terminate():
        comparisons = run_papers(folder, out, jobs, quick)
        page = write_papers_page(comparisons, out, quick)
    print_papers(comparisons)
    typer.echo(f"report page: {page}")
    if unexpected(comparisons):
        raise typer.Exit(1)


@app.command("report")
def report(
    directory: Path = typer.Argument(
        ...,
        help="A scenario's output folder, e.g. reports/convoy.",
        parser=nonempty_path,
        callback=out_folder,
    ),
    scenario: Path | None = typer.Option(
        None, "--scenario", help="Scenario TOML (default: the sweep's manifest, else scenarios/<name>.toml)."
    ),
    png: bool = typer.Option(True, "--png/--no-png", help="Also write a PNG per chart."),
) -> None:
    """Write DIR/index.html (renders offline) and a PNG per chart from `sim run` / `sim sweep` output."""
    from sim.report.build import build_report

    for path in build_report(directory, scenario, png):
        typer.echo(str(path))


@app.command("calibrate")
def calibrate(
    csv: Path | None = typer.Argument(None, help="Ground-truth CSV (default: the shipped calibration set)."),
    scale: float = typer.Option(
        0.1,
        "--scale",
        min=0.001,
        max=100.0,
        help="Stage length factor of the fitting simulations.",
    ),
    rounds: int = typer.Option(
        2, "--rounds", min=1, max=100, help="Fixed-point rounds (simulate, then fit)."
    ),
    cv_scale: float = typer.Option(
        0.25,
        "--cv-scale",
        min=0.001,
        max=100.0,
        help="Stage length factor of the CV simulations.",
    ),
    jobs: int = typer.Option(
        2, "--jobs", min=1, max=1024, help="Rows simulated in parallel (1: in-process)."
    ),
    write: Path | None = out_option(
        "Write the TOML here (default: print it).", out_file_problem, name="--write"
    ),
) -> None:
    """Fit the cost model's calibration to the steady-state ground-truth rows (see docs/fidelity.md)."""
    import sys

    from sim.studies.calibrate import run_calibration

    run_calibration(csv, scale, rounds, cv_scale, jobs, write, "sim calibrate " + " ".join(sys.argv[2:]))


@app.command("kernels")
def kernels(
    write: Path | None = out_option(
        "Write the per-GPU parameter file here (sim/catalog/kernel_gpus.toml).",
        out_file_problem,
        name="--write",
    ),
    import_vidur: Path | None = typer.Option(
        None, "--import-vidur", help="First convert Vidur's data/profiling folder into the catalog's tables."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fit per-GPU kernel parameters to the kernel profiles; test the transfer rule by leaving a GPU out."""
    import sys

    from sim.report.kernels import print_kernels

    print_kernels(write, import_vidur, as_json, "sim kernels " + " ".join(sys.argv[2:]))


@app.command("step")
def step(
    model: str = typer.Argument(..., help="Model: catalog name, HF id or config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. H100, H200, A100-80GB."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, max=64, help="Pipeline-parallel stages."),
    ep: int = typer.Option(1, "--ep", min=1, max=1024, help="Expert-parallel ranks (1 or tp x dp)."),
    dp: int = typer.Option(1, "--dp", min=1, max=1024, help="Data-parallel attention ranks."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=72, help="GPUs per node."),
    expert_skew: float = typer.Option(
        0.0, "--expert-skew", min=0.0, max=4.0, help="Zipf exponent of the gate."
    ),
    weight_dtype: str | None = typer.Option(None, "--weight-dtype", help="bf16 fp16 fp8 int8 int4."),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="KV-cache dtype (default: model dtype)."),
    batch: int | None = typer.Option(None, "--batch", help="Decode: sequences, a token each."),
    context: int | None = typer.Option(None, "--context", help="Decode step: cached tokens per sequence."),
    prefill: int | None = typer.Option(None, "--prefill", help="Prefill: one prompt of L tokens."),
    calibration: Path | None = typer.Option(None, "--calibration", help="A \\[calibration] TOML file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    weight_group_size: int | None = typer.Option(
        None, "--weight-group-size", min=0, max=1024, help="int4/int8 weights per 16-bit scale (0: per row)."
    ),
) -> None:
    """One step's time and kernel-by-kernel breakdown (kernel-level model; the engine uses the roofline)."""
    from sim.catalog.quantisation import check_format_options
    from sim.cost.parallel import Placement
    from sim.report.step import print_step

    check_format_options(weight_dtype, kv_dtype, weight_group_size)
    placement = Placement(tp, pp, ep, dp, None, gpus_per_node, expert_skew)
    if placement.beyond_tp:  # per stage and rank, with the communication kernels (sim/report/parallel.py)
        from sim.report.parallel import parallel_step
        from sim.report.step import step_rows

        c, q = step_rows(batch, context, prefill)
        parallel_step(model, gpu, placement, weight_dtype, kv_dtype, c, q, as_json)
        return
    print_step(model, gpu, tp, weight_dtype, kv_dtype, batch, context, prefill, calibration, as_json,
               weight_group_size)  # fmt: skip

"""The `sim` command line. Each command is a thin wrapper over a module that does the work."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from sim.io.errors import SimError
from sim.io.limits import (
    MAX_BLOCK_SIZE,
    MAX_COUNT,
    MAX_KV_BLOCKS,
    MAX_TOKENS,
    RUN_MAX_REQUESTS,
    RUN_MAX_TOKENS,
)

FORCE_HELP = (
    f"Run even when the estimated size exceeds {RUN_MAX_REQUESTS:,} requests or {RUN_MAX_TOKENS:,} tokens."
)


class _Typer(typer.Typer):
    """A Typer app whose commands turn `SimError` into `error: ...` on stderr and exit code 2."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, **kwargs)

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(func)
            def guarded(*a: Any, **kw: Any) -> Any:
                try:
                    return func(*a, **kw)
                except SimError as exc:
                    _print_error(str(exc))
                    raise typer.Exit(2) from None

            register(guarded)
            return func

        return decorator


app = _Typer(
    name="sim",
    help="servesim: simulate LLM inference serving (roofline cost model, batching policies, paged KV).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_error(message: str) -> None:
    """Each line of an error as `error: ...` on stderr."""
    for line in message.splitlines() or [""]:
        typer.echo(f"error: {line}", err=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `sim` console command and `python -m sim`.

    Bad input of any kind (a `SimError` from a command, an unknown option, a value out of range) prints
    `error: ...` and exits with code 2; Ctrl-C exits with 130.
    """
    try:
        code = app(args=list(argv) if argv is not None else None, standalone_mode=False)
    except typer.TyperException as exc:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
        else:
            _print_error(exc.format_message() if hasattr(exc, "format_message") else str(exc))
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def _nearest_folder(path: Path) -> Path:
    """The deepest existing path on the way to `path` (the working folder for a relative one)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def out_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be an output folder this process writes into (made if missing), else None."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a folder"
        base = path
    else:
        base = _nearest_folder(path)
        if not base.is_dir():
            return f"{base} is a file, not a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable"
    return None


def out_file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file in an existing, writable folder, else None."""
    if path.is_dir():
        return "is a folder; give a file name"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"folder {path.parent} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {path.parent} is not writable"
    return None


def _checked_out(problem: Callable[[Path], str | None]) -> Callable[[Path | None], Path | None]:
    """An option callback refusing, before the command runs, a path for which `problem` finds one."""

    def callback(value: Path | None) -> Path | None:
        why = None if value is None else problem(value)
        if why is not None:
            raise typer.BadParameter(f"{value}: {why}")
        return value

    return callback


def _check_formats(
    weight_dtype: str | None, kv_dtype: str | None, weight_group_size: int | None, any_int: bool = False
) -> None:
    """The `--weight-dtype`, `--kv-dtype` and `--weight-group-size` a scenario's `[model]` would accept
    (`any_int`: the group size applies to whichever int4 / int8 rows a comparison shows)."""
    from sim.catalog.quantisation import check_dtype, check_group_size

    for option, key, value in (
        ("--weight-dtype", "weight_dtype", weight_dtype),
        ("--kv-dtype", "kv_dtype", kv_dtype),
    ):
        try:
            check_dtype(key, value)
        except ValueError as err:
            raise SimError(f"{option}: {err} (got {value!r})") from None
    try:
        check_group_size("int4" if any_int else weight_dtype, weight_group_size)
    except ValueError as err:  # "weight_group_size: why", in the scenario's words
        why = str(err).partition(": ")[2].replace("model.weight_dtype", "--weight-dtype")
        raise SimError(f"--weight-group-size: {why}") from None


@app.command("replay-steps")
def replay_steps(
    trace: Path = typer.Argument(..., help="Trace: id, arrival_step, prompt_len, max_tokens, prefix_*, n."),
    out: Path | None = typer.Option(
        None, "--out", help="Write the steps as JSONL here.", callback=_checked_out(out_file_problem)
    ),
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
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output folder (default: reports/<scenario>).",
        callback=_checked_out(out_folder_problem),
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Simulate each policy of a scenario; write Parquet records, summary.json and manifest.json; print a
    comparison."""
    from sim.config.scenario import load_scenario
    from sim.io.outputs import exit_on_terminate, path_component
    from sim.io.progress import Stopwatch, run_progress
    from sim.report import console
    from sim.studies.run import run_to_folder
    from sim.studies.run_size import check_run_size

    sc = load_scenario(scenario, set_)
    names = policy or list(sc.policies)
    for name in names:
        if name not in sc.policies:
            raise SimError(f"{scenario}: no policy {name!r} (have: {', '.join(sc.policies)})")
    out_dir = out or Path("reports") / path_component(sc.name)
    if (why := out_folder_problem(out_dir)) is not None:
        raise SimError(f"output folder {out_dir}: {why}")
    check_run_size(sc, scenario.parent, str(scenario), force)
    summaries, manifest = [], None
    for name in names:
        watch = Stopwatch()
        progress = run_progress(name, sc.horizon.duration_s, sc.horizon.max_requests)
        with exit_on_terminate(), progress as hook:
            result = run_to_folder(sc, name, out_dir, scenario.parent, source=str(scenario), progress=hook)
        typer.echo(console.run_line(result.summary, watch))
        summaries.append(result.summary)
        manifest = result.manifest
    console.print_comparison(sc, summaries, out_dir)
    if manifest is not None:
        _note_mixed_runs(out_dir, manifest)


def _note_mixed_runs(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Say when `out_dir` also holds runs of another scenario, which `sim report` will not compare."""
    from sim.studies.run import other_scenario_runs

    others = other_scenario_runs(out_dir, manifest)
    if not others:
        return
    typer.echo(f"note: {out_dir} also holds runs of a different scenario; `sim report {out_dir}` will refuse")
    typer.echo("  to compare them. Re-run every policy with the same settings, or give another --out:")
    for folder, diff in others.items():
        shown = "; ".join(f"{key}: {theirs!r} there, {ours!r} here" for key, theirs, ours in diff[:4])
        more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
        typer.echo(f"  {folder}: {shown}{more}")


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
    from sim.report.capacity import capacity_report

    _check_formats(weight_dtype, kv_dtype, weight_group_size, any_int=quantisation)
    if len(models) > 1 and not compare:
        raise SimError("several models given: add --compare to show them side by side")
    if draft_model is not None and max_loras:
        raise SimError("give --draft-model or --max-loras, not both")
    if (draft_model is not None or max_loras) and (quantisation or weight_group_size is not None):
        raise SimError("--quantisation and --weight-group-size go without --draft-model and --max-loras")
    if draft_model is not None:  # speculative decoding: the KV the draft model takes (sim/engine/speculative.py)
        from sim.report.capacity import print_draft_capacity
        from sim.studies.capacity import draft_capacity

        if len(models) > 1:
            raise SimError("--draft-model takes one model")
        args = (models[0], gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, draft_model, draft_tp)
        print_draft_capacity(draft_capacity(*args, typical_len), as_json)
        return
    if max_loras:  # the LoRA slots' effect on one model's KV cache (sim/engine/lora.py)
        from sim.report.capacity import lora_capacity_report

        if len(models) > 1:
            raise SimError("--max-loras: give one model")
        lora_args = (gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_loras, max_lora_rank)
        if not as_json:
            capacity_report(models, gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_model_len,
                            typical_len)  # fmt: skip
        lora_capacity_report(models[0], *lora_args, typical_len, as_json)
        return
    capacity_report(
        models,
        gpu,
        tp=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        typical_len=typical_len,
        as_json=as_json,
        weight_group_size=weight_group_size,
        quantisation=quantisation,
    )


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
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output folder (default: reports/<scenario>).",
        callback=_checked_out(out_folder_problem),
    ),
) -> None:
    """Run the scenario's sweep table (rates x policies x params x replications); aggregate with CIs."""
    from sim.report.console import print_sweep
    from sim.studies.run_size import check_sweep_size
    from sim.studies.sweep import run_sweep

    check_sweep_size(scenario, set_, force)
    print_sweep(run_sweep(scenario, set_, jobs, executor, address, force, find_capacity, out))


@app.command("plan")
def plan(
    scenario: Path = typer.Argument(..., help="Scenario TOML file (its workload, SLO and policy)."),
    rate: float = typer.Option(..., "--rate", min=1e-6, max=1e6, help="Requests per second to serve."),
    gpus: str | None = typer.Option(
        None, "--gpus", help="GPU types, e.g. A100-80GB,H100-SXM (default: model.gpu)."
    ),
    max_gpus: int = typer.Option(16, "--max-gpus", min=1, max=4096, help="Most GPUs in a configuration."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=1024, help="Parallel runs (1: in-process)."),
    policy: str | None = typer.Option(None, "--policy", help="The policy to configure (default: the first)."),
    tp: str = typer.Option("1,2,4,8", "--tp", help="TP degrees to try."),
    max_num_seqs: str = typer.Option(
        "", "--max-num-seqs", help="Values to try, e.g. 64,256 (default: the policy's)."
    ),
    max_num_batched_tokens: str = typer.Option("", "--max-num-batched-tokens", help="Values to try."),
    modes: str = typer.Option(
        "colocated,pd", "--modes", help="colocated, pd (prefill/decode split), or both."
    ),
    attainment: float = typer.Option(
        0.9, "--attainment", min=0.01, max=1.0, help="Goodput share of the rate."
    ),
    explore: int = typer.Option(
        0, "--explore", min=0, max=1000, help="Configurations to run past the answer."
    ),
    rule: str = typer.Option("goodput", "--rule", help="goodput (share of the rate within the SLO) or p99."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set horizon.duration_s=120"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output folder (default: reports/<scenario>/plan).",
        callback=_checked_out(out_folder_problem),
    ),
) -> None:
    """The cheapest fleet (GPU, TP, knobs, replicas; colocated or prefill/decode) within the SLO at a rate."""
    from sim.io.outputs import path_component
    from sim.report.plan import print_plan, write_plan
    from sim.studies import plan as planner

    def ints(text: str, option: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise SimError(f"{option}: expected whole numbers separated by commas (got {text!r})") from None
        if any(v < 1 or v > 1_000_000 for v in values):
            raise SimError(f"{option}: each value must be in [1, 1000000] (got {text!r})")
        return values

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if not mode_list or set(mode_list) - {"colocated", "pd"}:
        raise SimError(f"--modes: colocated, pd or both, comma-separated (got {modes!r})")
    tps = ints(tp, "--tp")
    if not tps or any(t > 64 for t in tps):
        raise SimError(f"--tp: TP degrees in [1, 64] (got {tp!r})")
    knobs = {
        "max_num_seqs": ints(max_num_seqs, "--max-num-seqs"),
        "max_num_batched_tokens": ints(max_num_batched_tokens, "--max-num-batched-tokens"),
    }
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    result = planner.search(
        scenario,
        set_,
        rate,
        gpu_list,
        max_gpus,
        jobs,
        policy,
        tps,
        knobs,
        mode_list,
        attainment,
        explore,
        rule,
    )
    sc_name = path_component(planner.load_scenario(scenario, set_).name)
    out_dir = out or Path("reports") / sc_name / "plan"
    write_plan(result, scenario, out_dir)
    print_plan(result, out_dir)


@app.command("validate")
def validate(
    target: str = typer.Argument(..., help="What to validate against: ground-truth."),
    csv: Path | None = typer.Argument(None, help="Ground-truth CSV (default: the shipped calibration set)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write fidelity.csv and fidelity.html here.",
        callback=_checked_out(out_folder_problem),
    ),
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


@app.command("report")
def report(
    directory: Path = typer.Argument(..., help="A scenario's output folder, e.g. reports/convoy."),
    scenario: Path | None = typer.Option(
        None, "--scenario", help="Scenario TOML (default: the sweep's manifest, else scenarios/<name>.toml)."
    ),
    png: bool = typer.Option(True, "--png/--no-png", help="Also write a PNG per chart."),
) -> None:
    """Write DIR/index.html (renders offline) and a PNG per chart from `sim run` / `sim sweep` output."""
    from sim.report import build_report

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
    write: Path | None = typer.Option(
        None,
        "--write",
        help="Write the TOML here (default: print it).",
        callback=_checked_out(out_file_problem),
    ),
) -> None:
    """Fit the cost model's calibration to the steady-state ground-truth rows (see docs/fidelity.md)."""
    import sys

    from sim.studies.calibrate import run_calibration

    run_calibration(csv, scale, rounds, cv_scale, jobs, write, "sim calibrate " + " ".join(sys.argv[2:]))


@app.command("step")
def step(
    model: str = typer.Argument(..., help="Model: catalog name, HF id or config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. H100, H200, A100-80GB."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor parallel degree."),
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
    from sim.report.step import print_step

    _check_formats(weight_dtype, kv_dtype, weight_group_size)
    print_step(model, gpu, tp, weight_dtype, kv_dtype, batch, context, prefill, calibration, as_json,
               weight_group_size)  # fmt: skip

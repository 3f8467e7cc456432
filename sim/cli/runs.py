"""`sim run`, `sim sweep`, `sim report` and `sim replay-steps`: runs of a scenario, and the page over them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from sim.cli.app import FORCE_HELP, app, collector_for_a_run
from sim.io.errors import SimError
from sim.io.limits import MAX_BLOCK_SIZE, MAX_COUNT, MAX_KV_BLOCKS, MAX_TOKENS
from sim.io.paths import out_file_problem, out_folder_problem, shown
from sim.report.options import nonempty_path, out_folder, out_option


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
    with collector_for_a_run() as started:
        _run(scenario, set_, policy, out, force, started)


def _run(
    scenario: Path,
    set_: list[str],
    policy: list[str],
    out: Path | None,
    force: bool,
    started: Callable[[], None],
) -> None:
    """`sim run`'s work, its options as given; `started()` once the scenario is read and checked."""
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
    started()
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

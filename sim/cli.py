"""The `sim` command line. Each command is a thin wrapper over a module that does the work."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sim.errors import SimError

app = typer.Typer(
    name="sim",
    help="servesim: simulate LLM inference serving (roofline cost model, batching policies, paged KV).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    """Entry point: user errors print a clear message and exit with code 2, without a traceback."""
    try:
        app()
    except SimError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


@app.command("replay-steps")
def replay_steps(
    trace: Path = typer.Argument(..., help="Trace JSON: id, arrival_step, prompt_len, max_tokens, prefix_*."),
    out: Path | None = typer.Option(None, "--out", help="Write the steps as JSONL here."),
    compare: Path | None = typer.Option(None, "--compare", help="Expected steps (.jsonl[.gz]) to compare."),
    block_size: int | None = typer.Option(None, "--block-size"),
    num_blocks: int | None = typer.Option(None, "--num-blocks"),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens"),
    max_model_len: int | None = typer.Option(None, "--max-model-len"),
    prefix_caching: bool | None = typer.Option(None, "--prefix-caching/--no-prefix-caching"),
    chunked_prefill: bool | None = typer.Option(None, "--chunked-prefill/--no-chunked-prefill"),
    long_prefill_token_threshold: int | None = typer.Option(None, "--long-prefill-token-threshold"),
    watermark: float | None = typer.Option(None, "--watermark", help="Fraction of KV blocks kept free."),
) -> None:
    """Replay a trace through the vllm scheduler in step time; optionally compare with a vLLM log.

    Settings not given come from EXPECTED's config line (with --compare), else from the oracle defaults.
    """
    from sim import replay

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

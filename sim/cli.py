"""The `sim` command line. Each command is a thin wrapper over a module that does the work."""

from __future__ import annotations

import sys

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

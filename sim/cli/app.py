"""The `sim` app: its options, `--version`, and `main`, which turns bad input into `error:` lines."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import typer

import sim
from sim.io.limits import RUN_MAX_REQUESTS, RUN_MAX_TOKENS
from sim.report.options import GuardedTyper, print_error

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


@contextmanager
def collector_for_a_run() -> Iterator[Callable[[], None]]:
    """Python's cyclic garbage collector off while a run starts, then on for the run; as it was after.

    Start-up (the imports, the scenario read and checked) leaves about 69,000 objects for the collector
    to track, nearly all of them alive to the end, and next to no reference cycles; yet the collector's
    passes over them cost a 10,000-request `sim run` a few percent of its CPU (docs/performance.md). So
    the block starts with the collector off; calling what it yields ends start-up: the objects made so far
    are frozen (`gc.freeze`: no later pass looks at them) and the collector is on again, for the run's own
    cycles (a fleet's make many). At the block's end the objects are unfrozen and the collector is as it
    was.
    """
    enabled = gc.isenabled()
    frozen = False
    gc.disable()

    def started() -> None:
        nonlocal frozen
        gc.freeze()
        frozen = True
        if enabled:
            gc.enable()

    try:
        yield started
    finally:
        if frozen:
            gc.unfreeze()
        if enabled:
            gc.enable()


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
    """The `sim` command line on `argv` (default: the process's arguments); ends in `SystemExit`.

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


def entry() -> None:
    """Entry point of the `sim` console command and `python -m sim`: `main`, then the process ends.

    Freeing every object of every loaded module one by one (numpy, polars, pydantic's validators) costs a
    short `sim run` a noticeable share of its CPU, for nothing: the process is over. So once the
    command has finished, the exit handlers run, the standard streams are flushed and the process ends
    with the command's exit code, without that teardown. It is the plain `sys.exit` when another thread is
    still alive (its end is awaited), when the code is not a number, or when a stream cannot be flushed.
    """
    try:
        main()
    except SystemExit as done:
        code = done.code
        if not (code is None or isinstance(code, int)) or threading.active_count() > 1:
            raise
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe: the interpreter's own exit reports it
            raise done from None
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):  # what the exit handlers printed
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code or 0)

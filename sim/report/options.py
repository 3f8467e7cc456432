"""The command line's plumbing: a Typer app whose commands show a `SimError` as `error: ...` lines and exit
code 2, and the path options, checked before a command runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

from sim.io.errors import SimError
from sim.io.paths import out_folder_problem, shown


class _WholeNames:
    """Help that shows every option name whole (sim/report/help.py, loaded with the help only: its rich
    tables would cost every run's start-up a fifth of a second)."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from sim.report.help import install

        install()
        super().format_help(ctx, formatter)  # type: ignore[misc]


class _WholeNamesCommand(_WholeNames, TyperCommand):
    """A command of `sim` (its help shows every option name whole)."""


class _WholeNamesGroup(_WholeNames, TyperGroup):
    """The `sim` group (its help shows every option name whole)."""


class GuardedTyper(typer.Typer):
    """A Typer app whose commands turn `SimError` into `error: ...` on stderr and exit code 2, and whose
    help pages show every option name whole."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=_WholeNamesGroup, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, cls=_WholeNamesCommand, **kwargs)

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(func)
            def guarded(*a: Any, **kw: Any) -> Any:
                try:
                    return func(*a, **kw)
                except SimError as exc:
                    print_error(str(exc))
                    raise typer.Exit(2) from None

            register(guarded)
            return func

        return decorator


def print_error(message: str) -> None:
    """Each line of an error as `error: ...` on stderr."""
    for line in message.splitlines() or [""]:
        typer.echo(f"error: {line}", err=True)


def out_option(
    help: str, problem: Callable[[Path], str | None] = out_folder_problem, name: str = "--out"
) -> Any:
    """An output path option refusing, before the command runs, a path for which `problem` finds one."""

    def callback(value: Path | None) -> Path | None:
        why = None if value is None else problem(value)
        if why is not None:
            raise typer.BadParameter(f"{shown(value)}: {why}")
        return value

    return typer.Option(None, name, help=help, parser=nonempty_path, metavar="<path>", callback=callback)


def nonempty_path(value: str) -> Path:
    """A path option's text as a Path; the empty text is refused (it would mean the working folder)."""
    if not value:
        raise typer.BadParameter("an empty path; give a folder or file name")
    return Path(value)


def out_folder(value: Path) -> Path:
    if (why := out_folder_problem(value)) is not None:
        raise typer.BadParameter(f"{shown(value)}: {why}")
    return value

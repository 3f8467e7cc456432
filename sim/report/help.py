"""The `sim` commands' `--help` pages: every option name shown whole at 80 columns.

Typer draws each panel of a command's options as a rich table: one column for the long names, one for the
short, one each for a flag's `--no-...` names, then the type and the help. When the terminal is narrow, rich
shrinks the widest columns alike, the names' among them, and cuts them (`--long-prefill-t…` at 80 columns).
`WholeNamesTable` takes the place of the table class Typer's help renderer uses (`install`): a row's option
names share one cell, a name a line (a flag's `--x` over its `--no-x`); that column is never wrapped or
shrunk; the columns no row fills are left out; the type and help columns wrap in the width left.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import typer.rich_utils
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

OPTION_NAMES = re.compile(r"^--?[A-Za-z0-9][\w-]*(,--?[A-Za-z0-9][\w-]*)*$")


def _names(cell: Any) -> bool:
    return isinstance(cell, Text) and bool(OPTION_NAMES.match(cell.plain))


def _blank(cell: Any) -> bool:
    return cell is None or (isinstance(cell, (Text, str)) and not str(cell).strip())


class WholeNamesTable(Table):
    """A help table whose option-name column keeps every name whole (see the module docstring)."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        cells = list(renderables)
        at = [i for i, cell in enumerate(cells) if _names(cell)]
        if len(at) > 1:
            cells[at[0]] = Text("\n").join(cells[i] for i in at)
            for i in at[1:]:
                cells[i] = Text("")
        super().add_row(*cells, **kwargs)
        if at:
            self.columns[at[0]].no_wrap = True

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        every = self.columns
        kept = [c for c in every if c.header or not all(_blank(cell) for cell in c._cells)]
        self.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(kept)]
        try:
            yield from super().__rich_console__(console, options)
        finally:
            self.columns = every


def install() -> None:
    """Make Typer's help renderer draw its tables as `WholeNamesTable`."""
    typer.rich_utils.Table = WholeNamesTable  # type: ignore[attr-defined,misc]

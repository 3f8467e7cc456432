"""`sim papers` table: per cell, the paper's figure, the simulator's, their ratio, tolerance and verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sim.studies.papers import Comparison, as_rows


def print_papers(comparisons: list[Comparison], console: Console | None = None) -> None:
    console = console or Console()
    for comparison in comparisons:
        table = Table(title=f"{comparison.paper.paper}: {comparison.path.name}", title_justify="left")
        for column in ("cell", "paper", "sim", "ratio", "tolerance", "verdict"):
            table.add_column(column, justify="right" if column in ("ratio", "tolerance") else "left")
        for row in as_rows([comparison]):
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
            table.add_row(
                row["cell"], row["paper"], row["sim"], ratio, f"±{row['tolerance']:.0%}", row["status"]
            )  # fmt: skip
        console.print(table)
        console.print("  where each paper figure is read: docs/papers.md", highlight=False)
        for v in comparison.verdicts:
            if not v.passed and v.cell.known_gap:
                console.print(f"  known gap, {v.cell.name}: {v.cell.known_gap}", highlight=False)

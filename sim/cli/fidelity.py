"""`sim validate`, `sim calibrate`, `sim papers`: the simulator against measurements and published figures."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sim.cli.app import app
from sim.io.errors import SimError
from sim.io.paths import out_file_problem
from sim.report.options import out_option


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
    seeds: int = typer.Option(
        1,
        "--seeds",
        min=1,
        max=100,
        help="Workload seeds: fit and cross-validate on each, give the CV figures' 95% intervals.",
    ),
) -> None:
    """Fit the cost model's calibration to the steady-state ground-truth rows (see docs/fidelity.md)."""

    from sim.studies.calibrate import run_calibration

    command = "sim calibrate " + " ".join(sys.argv[2:])
    run_calibration(csv, scale, rounds, cv_scale, jobs, write, command, seeds)


@app.command("papers")
def papers(
    folder: Path = typer.Argument(Path("scenarios/papers"), help="Folder of *.paper.toml comparisons."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=1024, help="Parallel runs (1: in-process)."),
    quick: bool = typer.Option(False, "--quick", help="Reduced form: shorter runs, tolerances doubled."),
    out: Path | None = out_option("Output folder (default: reports/papers)."),
    only: list[str] | None = typer.Option(
        None, "--only", help="Run only this comparison (NAME of NAME.paper.toml); repeat for several."
    ),
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
        comparisons = run_papers(folder, out, jobs, quick, only=only)
        page = write_papers_page(comparisons, out, quick)
    print_papers(comparisons)
    typer.echo(f"report page: {page}")
    if unexpected(comparisons):
        raise typer.Exit(1)

"""Every command in the README's shell blocks runs as written, in the order the README gives them.

`COVERED` maps each command, as the README writes it, to how it is run: the `sim` commands through the CLI
(each optional `[...]` part left out, then all of them in, with the placeholders given values), the slow ones
at a reduced scale (`REDUCED`: the README says next to each that it is slow), `make` targets by checking that
the target exists and that its recipe's `sim` commands are among the README's and its files exist. A README
command missing from `COVERED` fails the test, as does an entry of `COVERED` the README no longer shows.
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)
PLACEHOLDERS = {"N": "2", "DIR": "out/readme"}  # the values the optional parts' placeholders take
runner = CliRunner()

MAKE = "make"
ACTIVATE = "activate"
SIM = "sim"
DASK = "dask"
DASK_SCHEDULER = "tcp://HOST:8786"  # the README's scheduler address; the test's local cluster stands in
DASK_SWEEP = f"sim sweep scenarios/convoy.toml --executor dask --address {DASK_SCHEDULER} --find-capacity"
DASK_PLAN = (
    "sim plan scenarios/plan-llama70b-chat.toml --rate 20 --executor dask"
    f" --address {DASK_SCHEDULER} --jobs 9"
)
SWEEP = "sim sweep scenarios/convoy.toml [--jobs 2] [--find-capacity]"
VALIDATE = "sim validate ground-truth --scale 0.25 --jobs 2 [--out DIR]"
REPLAY = (
    "sim replay-steps tests/data/oracle/basic.trace.json --compare tests/data/oracle/basic.steps.jsonl.gz"
)
PLAN = (
    "sim plan scenarios/plan-llama70b-chat.toml --rate 20 --gpus A100-80GB,H100-SXM,L40S --max-gpus 32"
    " --rule p99"
)
PAPERS = "sim papers --jobs 2 [--quick]"
# README command -> how it is run: MAKE (the target is checked), ACTIVATE (the environment `make venv` makes
# has the script), SIM (run through the CLI; with the changes in REDUCED when it is slow), DASK (as SIM, on a
# local two-worker dask cluster at the README's scheduler address).
COVERED = {
    "make run": MAKE,
    "make test": MAKE,
    ". .venv/bin/activate": ACTIVATE,
    "sim run scenarios/convoy.toml": SIM,
    "sim run scenarios/convoy.toml --set workload.arrival.rate=3 --out reports/convoy-3rps": SIM,
    "sim report reports/convoy": SIM,
    "sim report reports/convoy-3rps": SIM,
    "sim capacity llama-2-7b --gpu A100-80GB": SIM,
    "sim capacity --compare llama-2-7b mistral-7b --gpu A100-80GB": SIM,
    "sim step llama-3.1-8b --gpu H200 --batch 32 --context 1024 [--tp N] [--json]": SIM,
    "sim step llama-2-70b --gpu A100 --tp 2 --prefill 4096": SIM,
    "sim run scenarios/convoy.toml [--set workload.arrival.rate=3] [--policy continuous] [--out DIR]": SIM,
    SWEEP: SIM,
    REPLAY: SIM,
    VALIDATE: SIM,
    "sim schema": SIM,
    "sim --version": SIM,
    PLAN: SIM,
    "make bench": MAKE,
    "make validate": MAKE,
    "make papers": MAKE,
    "sim kernels": SIM,
    PAPERS: SIM,
    DASK_SWEEP: DASK,
    DASK_PLAN: DASK,
}
REDUCED_SWEEP = [
    "--set", "horizon.duration_s=40", "--set", "sweep.replications=1", "--set", "sweep.rates=[1,4]",
]  # fmt: skip
# The slow commands (about half a minute each on two cores), and how the test runs them at a reduced scale.
REDUCED = {
    SWEEP: REDUCED_SWEEP,
    VALIDATE: ["--scale", "0.02", "--row", "llama-2-7b"],  # five of its rows, each 0.02 as long
    PAPERS: ["--quick"],
    DASK_SWEEP: REDUCED_SWEEP,
    PLAN: ["--settle-seeds", "0"],  # no configuration settled on five 600 s runs
    DASK_PLAN: ["--settle-seeds", "0"],
}


# `sim papers` runs here on these comparisons only: tests/test_papers.py runs every one in its reduced form.
PAPERS_KEPT = ("vllm-spec-cnn",)


def keep_only_papers(folder: Path, names: tuple[str, ...]) -> None:
    """Remove from `folder` every comparison (`NAME.paper.toml`) but `names`."""
    for spec in folder.glob("*.paper.toml"):
        if spec.name.removesuffix(".paper.toml") not in names:
            spec.unlink()


def readme_commands() -> list[str]:
    """The commands of the README's shell blocks, in order: `\\` continuations joined, comments dropped,
    runs of spaces made one."""
    commands = []
    for block in SHELL_BLOCK.findall(README):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if command:
                commands.append(command)
    return commands


def optional_parts(command: str) -> tuple[list[str], list[list[str]]]:
    """A command's words outside `[...]`, and the words of each `[...]` part."""
    parts = [shlex.split(p) for p in re.findall(r"\[([^\]]*)\]", command)]
    return shlex.split(re.sub(r"\s*\[[^\]]*\]", "", command)), parts


def variants(command: str, every_subset: bool = False) -> list[list[str]]:
    """The argument lists a README command stands for (without its leading `sim`): its optional parts all
    left out and all put in (or, `every_subset`, each combination), placeholders as they are."""
    words, parts = optional_parts(command)
    sizes = range(len(parts) + 1) if every_subset else sorted({0, len(parts)})
    chosen = [c for size in sizes for c in itertools.combinations(parts, size)]
    return [[*words[1:], *(w for part in c for w in part)] for c in chosen]


def filled(args: list[str]) -> list[str]:
    return [PLACEHOLDERS.get(a, a) for a in args]


def reduced(args: list[str], extra: list[str]) -> list[str]:
    """`args` with `extra` added: an option `args` already has (`--scale`) takes `extra`'s value instead;
    `--set` options are added; a flag (an option with no value after it, `--quick`) is added once."""
    out = list(args)
    i = 0
    while i < len(extra):
        option = extra[i]
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else None
        i += 1 if value is None else 2
        if value is None:
            out += [] if option in out else [option]
        elif option != "--set" and option in out:
            out[out.index(option) + 1] = value
        else:
            out += [option, value]
    return out


def slow_lines() -> dict[str, str]:
    """README command -> its line(s) in the README, comments included (where the README says it is slow)."""
    out = {}
    for block in SHELL_BLOCK.findall(README):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if command:
                follow = itertools.takewhile(lambda x: x.strip().startswith("#"), lines[i + 1 :])
                out[command] = " ".join([line, *follow])
    return out


def make_recipe(target: str) -> list[str]:
    """The recipe lines of a Makefile target (AssertionError when the target is missing)."""
    found = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", MAKEFILE, re.M)
    assert found is not None, f"Makefile: no target {target!r} (the README runs `make {target}`)"
    return [line.strip() for line in found.group(1).splitlines()]


def test_every_readme_command_is_covered() -> None:
    commands = readme_commands()
    assert len(commands) >= 20, commands  # the blocks were found
    missing = [c for c in commands if c not in COVERED]
    assert not missing, f"README commands this test does not run; add them to COVERED: {missing}"
    stale = [c for c in COVERED if c not in commands]
    assert not stale, f"COVERED lists commands the README no longer shows: {stale}"
    assert set(REDUCED) <= {c for c, how in COVERED.items() if how in (SIM, DASK)}


def test_the_readme_says_which_commands_are_slow() -> None:
    lines = slow_lines()
    for command in REDUCED:
        assert re.search(r"\bminutes?\b", lines[command]), f"README: say how long this takes: {command}"


@pytest.mark.parametrize("target", [c.split()[1] for c, how in COVERED.items() if how == MAKE])
def test_the_readme_make_targets_exist_and_run_what_the_readme_shows(target: str) -> None:
    shown = [[*words] for c, how in COVERED.items() if how == SIM for words in variants(c, every_subset=True)]
    for line in make_recipe(target):
        words = shlex.split(line.lstrip("@"))
        if words[0] == "$(BIN)/sim":  # a sim command: one the README shows (placeholders match any word)
            args = words[1:]
            assert any(
                len(s) == len(args) and all(a == b or a in PLACEHOLDERS for a, b in zip(s, args, strict=True))
                for s in shown
            ), f"Makefile {target}: `sim {' '.join(args)}` is not among the README's commands"
        for word in words[1:]:  # the files it names (tests, benchmarks, scenarios) exist
            if re.match(r"^(tests|benchmarks|scenarios)/", word):
                assert (ROOT / word).is_file(), f"Makefile {target}: {word} is missing"


def test_activate_is_made_by_make_venv() -> None:
    recipe = make_recipe("$(STAMP)")
    assert "$(PYTHON) -m venv $(VENV)" in recipe and "venv: $(STAMP)" in MAKEFILE
    assert re.search(r"^VENV\s*:=\s*\.venv$", MAKEFILE, re.M)  # so the script is .venv/bin/activate


@pytest.fixture
def repo_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with the scenarios and the oracle data, as the README's relative paths expect."""
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    shutil.copytree(ROOT / "tests" / "data" / "oracle", tmp_path / "tests" / "data" / "oracle")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_sim_command_of_the_readme_runs_as_written(repo_like: Path) -> None:
    """In the README's order, so that `sim report` finds the runs before it (slow ones at REDUCED scale)."""
    ran: set[tuple[str, ...]] = set()
    keep_only_papers(repo_like / "scenarios" / "papers", PAPERS_KEPT)
    for command in readme_commands():
        if COVERED.get(command) != SIM:
            continue
        for args in variants(command):
            args = reduced(filled(args), REDUCED.get(command, []))
            if tuple(args) in ran:  # the same argument list as an earlier command's: run once
                continue
            result = runner.invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
            ran.add(tuple(args))
    assert len(ran) >= 20
    assert (repo_like / "reports" / "convoy" / "index.html").is_file()
    assert (repo_like / "reports" / "convoy" / "sweep" / "capacity.json").is_file()
    assert (repo_like / PLACEHOLDERS["DIR"] / "fidelity.html").is_file()


def test_the_readme_dask_commands_run_on_a_local_cluster(repo_like: Path) -> None:
    """The README's sweep and plan on a dask cluster, as written, with a local two-worker cluster standing in
    for the scheduler at `tcp://HOST:8786` (the sweep at its REDUCED scale)."""
    distributed = pytest.importorskip("dask.distributed")  # in the dev extra; skipped only without it
    commands = [c for c in readme_commands() if COVERED.get(c) == DASK]
    assert sorted(commands) == sorted(c for c, how in COVERED.items() if how == DASK)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, protocol="tcp://", dashboard_address=None
    ) as cluster:
        for command in commands:
            args = reduced(filled(variants(command)[0]), REDUCED.get(command, []))
            args = [cluster.scheduler_address if a == DASK_SCHEDULER else a for a in args]
            result = runner.invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
    assert (repo_like / "reports" / "convoy" / "sweep" / "capacity.json").is_file()
    assert (repo_like / "reports" / "plan-llama70b-chat" / "plan" / "plan.json").is_file()

"""The README's commands work as written (at a small scale), and what it claims about the outputs holds."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import sim
from sim.cli import app, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SMALL = ["--set", "horizon.duration_s=40"]
runner = CliRunner()


def session_commands() -> list[list[str]]:
    """The `sim ...` lines of the README's first-session block, comments dropped."""
    block = re.search(r"## A first session\s+```bash\n(.*?)```", README, re.S)
    assert block is not None, "README: the first-session block is gone"
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("sim ")]


@pytest.fixture
def repo_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with the shipped scenarios, as the README's relative paths expect."""
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(args: list[str]) -> str:
    if args[0] == "run":
        args = [*args, *SMALL]
    if args[0] == "report":
        args = [*args, "--no-png"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
    return result.output


def test_the_first_session_produces_one_correct_report_per_rate(repo_like: Path) -> None:
    commands = session_commands()
    assert [c[0] for c in commands] == ["run", "run", "report", "report"]
    for args in commands:
        invoke(args)
    for folder, rate in (("convoy", 1), ("convoy-3rps", 3)):
        html = (repo_like / "reports" / folder / "index.html").read_text()
        assert f"At {rate} req/s, continuous keeps p99 TTFT" in html
        for policy in ("static", "continuous"):
            manifest = json.loads((repo_like / "reports" / folder / policy / "manifest.json").read_text())
            assert manifest["compared"]["workload"]["arrival"]["rate"] == rate


def test_the_mix_the_readme_warns_about_is_refused(repo_like: Path) -> None:
    invoke(["run", "scenarios/convoy.toml"])
    mixed = re.search(r"\(say `(--set [^`]+)`\s+into `reports/convoy`\)", README.replace("\n", " "))
    assert mixed is not None, "README: the mixed-run example is gone"
    invoke(["run", "scenarios/convoy.toml", *shlex.split(mixed.group(1))])
    result = runner.invoke(app, ["report", "reports/convoy", "--no-png"])
    assert (
        result.exit_code == 2 and "workload.arrival.rate: 3.0 in continuous, 1.0 in static" in result.output
    )


def test_example_paths_in_the_readme_exist() -> None:
    paths = re.findall(r"(?:tests|scenarios)/[\w./-]+\.(?:json|gz|toml)", README)
    assert any(p.startswith("tests/data/oracle/") for p in paths)  # replay-steps has a real example
    for path in paths:
        assert (ROOT / path).is_file(), path


def test_static_tpot_exceeds_its_itl_as_the_readme_explains(repo_like: Path) -> None:
    result = runner.invoke(
        app, ["run", "scenarios/convoy.toml", "--set", "horizon.duration_s=120", "--out", "out"]
    )
    assert result.exit_code == 0, result.output
    s = {
        p: json.loads((repo_like / "out" / p / "summary.json").read_text()) for p in ("static", "continuous")
    }
    static, cont = s["static"]["latency"], s["continuous"]["latency"]
    assert static["tpot"]["mean"] > 2 * static["itl"]["mean"]  # padding is in TPOT, not in ITL
    assert cont["tpot"]["mean"] == pytest.approx(cont["itl"]["mean"], rel=0.1)


def test_make_says_what_it_does_while_installing() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    out = subprocess.run(
        [make, "--no-print-directory", "-n", "-B", ".venv/.installed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    first = [line for line in out.splitlines() if not line.startswith("make")][0]
    assert first.startswith("echo") and "installing servesim" in first  # said before pip starts


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("sweep", "with a [sweep] table"),
        ("sweep", "under [slo]"),
        ("step", "A [calibration] TOML"),
        ("validate", "A [calibration] TOML"),
    ],
)
def test_help_shows_table_names_in_brackets(command: str, shown: str) -> None:
    """Rich read `[sweep]` as markup and dropped it: the help said "a  table"."""
    result = CliRunner().invoke(app, [command, "--help"])
    text = re.sub(r"[\s│]+", " ", result.output)  # the help wraps in a box
    assert result.exit_code == 0 and shown in text, text


def test_the_readme_shows_validate_as_make_validate_runs_it() -> None:
    """The bar is judged at the scale it was measured at: the README's command is the Makefile's."""
    make = re.search(r"\$\(BIN\)/sim (validate ground-truth [^\n]*)", (ROOT / "Makefile").read_text())
    assert make is not None, "Makefile: the validate target is gone"
    made = shlex.split(make.group(1))
    made = made[: made.index("--out")] if "--out" in made else made
    shown = re.search(r"^sim (validate ground-truth [^#\[]*)", README, re.M)
    assert shown is not None, "README: the validate command is gone"
    assert shlex.split(shown.group(1)) == made
    assert f"--scale {made[made.index('--scale') + 1]}" in README.split("## Correctness")[1]


def _about(quoted: str, value_s: float) -> bool:
    """`quoted` (ms, as the README writes it) is `value_s` rounded to the digits the README gives."""
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return f"{value_s * 1e3:.{digits}f}" == quoted


def test_the_tpot_and_itl_figures_the_readme_quotes_are_the_convoy_runs(repo_like: Path) -> None:
    """The figures under "Why static batching's TPOT exceeds its ITL" are the run it names, as shipped."""
    text = re.sub(r"\s+", " ", README)
    run = re.search(r"In the convoy scenario \(`sim (run [^`]+)`\)", text)
    quoted = re.search(
        r"static batching's mean TPOT is about ([\d.]+) ms against a mean ITL of about ([\d.]+) ms; "
        r".*? the two agree \(mean TPOT and ITL both about ([\d.]+) ms\)",
        text,
    )
    assert run is not None and quoted is not None, "README: the TPOT / ITL figures are gone"
    result = runner.invoke(app, [*shlex.split(run.group(1)), "--out", "out"])
    assert result.exit_code == 0, result.output
    lat = {
        p: json.loads((repo_like / "out" / p / "summary.json").read_text())["latency"]
        for p in ("static", "continuous")
    }
    static_tpot, static_itl, both = quoted.groups()
    assert _about(static_tpot, lat["static"]["tpot"]["mean"]), lat["static"]["tpot"]
    assert _about(static_itl, lat["static"]["itl"]["mean"]), lat["static"]["itl"]
    assert _about(both, lat["continuous"]["tpot"]["mean"]), lat["continuous"]["tpot"]
    assert _about(both, lat["continuous"]["itl"]["mean"]), lat["continuous"]["itl"]


def _convoy_named(path: Path, name: str, policy: str) -> Path:
    text = (ROOT / "scenarios" / "convoy.toml").read_text()
    text = text.replace('name = "convoy"', f"name = {json.dumps(name)}", 1)
    path.write_text(text.replace("[policies.static]", f"[policies.{json.dumps(policy)}]", 1))
    return path


def test_names_become_folders_as_the_readme_says(repo_like: Path) -> None:
    """What the README says of a scenario `name` or policy name that is no plain folder name holds."""
    text = re.sub(r"\s+", " ", README)
    refused = re.search(r"any other character, such as `([^`]+)`, is refused with exit code 2", text)
    hashed = re.search(
        r"a scenario named `([^`]+)` writes to `reports/([^`]+)/`, a policy named `([^`]+)` .*? to "
        r"`([^`]+)/`",
        text,
    )
    assert refused is not None and hashed is not None, "README: what becomes of names is gone"
    bad = refused.group(1)
    for name, policy, key in ((bad, "static", "name"), ("convoy", bad, f"policies.{bad}")):
        result = runner.invoke(app, ["run", str(_convoy_named(repo_like / "bad.toml", name, policy)), *SMALL])
        assert result.exit_code == 2 and f"bad.toml: {key}:" in result.output, result.output
    scenario, folder, policy, policy_folder = hashed.groups()
    invoke(["run", str(_convoy_named(repo_like / "odd.toml", scenario, policy))])
    assert sorted(p.name for p in (repo_like / "reports").iterdir()) == [folder]
    assert (repo_like / "reports" / folder / policy_folder / "summary.json").is_file()


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"servesim {sim.__version__}\n"


def _commands() -> list[list[str]]:
    group = typer.main.get_command(app)
    return [[], *([name] for name in group.commands)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "sim")
def test_help_at_80_columns_shows_every_option_name_whole(command: list[str]) -> None:
    """Rich shrank the options table's columns alike: `--long-prefill-t…` in `sim replay-steps --help`."""
    group = typer.main.get_command(app)
    params = (group.commands[command[0]] if command else group).params  # type: ignore[attr-defined]
    names = [n for p in params for n in (*p.opts, *p.secondary_opts) if n.startswith("-")]
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    lines = result.output.splitlines()
    assert result.exit_code == 0 and max(map(len, lines)) <= 80, result.output
    for name in names:
        assert re.search(re.escape(name) + r"(?![\w…-])", result.output), (name, result.output)


def test_the_scenarios_table_lists_every_shipped_scenario() -> None:
    table = re.search(r"## Scenarios\n(.*?)\n## ", README, re.S)
    assert table is not None, "README: the scenarios table is gone"
    listed = set(re.findall(r"^\| `([\w.-]+\.toml)` \|", table.group(1), re.M))
    shipped = {p.name for p in (ROOT / "scenarios").glob("*.toml")}
    assert listed == shipped

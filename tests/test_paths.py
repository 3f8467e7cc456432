"""Names from a scenario never lead outside the output folder, and output files get the umask's modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_manifest import TINY
from typer.testing import CliRunner

from sim.cli import app, main
from sim.io.outputs import SAFE_CHARS, path_component
from sim.studies import sweep

runner = CliRunner()
HOSTILE = (
    TINY.replace('name = "tiny"', 'name = ".."')
    .replace("[policies.static]", '[policies."x.y"]')
    .replace("[policies.continuous]", "[policies.sweep]")
)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@given(st.text(max_size=40))
def test_path_component_is_one_safe_name(name: str) -> None:
    part = path_component(name, frozenset({"sweep"}))
    assert part and set(part) <= SAFE_CHARS and part not in {".", "..", "sweep"}
    assert Path(part).name == part and len(part) <= 120
    if name and set(name) <= SAFE_CHARS and name.strip(".") and name != "sweep":
        assert part == name  # ordinary names are kept as they are


@given(st.text(max_size=12), st.text(max_size=12))
def test_distinct_names_get_distinct_folders(a: str, b: str) -> None:
    if a != b:
        assert path_component(a) != path_component(b)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_a_policy_name_that_is_a_path_is_refused_before_anything_is_written(in_tmp: Path) -> None:
    path = in_tmp / "hostile.toml"
    path.write_text(HOSTILE.replace('[policies."x.y"]', '[policies."../../x"]'))
    before = files_under(in_tmp.parent)
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and "policies.../../x" in result.output, result.output
    assert files_under(in_tmp.parent) == before


def test_hostile_scenario_and_policy_names_stay_in_the_output_folder(in_tmp: Path) -> None:
    path = in_tmp / "hostile.toml"
    path.write_text(HOSTILE + '\n[sweep]\nrates = [1]\npolicies = ["x.y"]\n')
    outside = in_tmp.parent
    before = files_under(outside)
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["sweep", str(path), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    new = files_under(outside) - before
    reports = (in_tmp / "reports").resolve()
    assert new and all(p.resolve().is_relative_to(reports) for p in new), sorted(map(str, new))
    (folder,) = [p for p in reports.iterdir()]  # the scenario's own folder, under reports/
    runs = sorted(p.name for p in folder.iterdir() if (p / "summary.json").is_file())
    assert len(runs) == 2 and "sweep" not in runs  # a policy named "sweep" does not take the sweep's folder
    assert (folder / "sweep" / "manifest.json").is_file()
    result = runner.invoke(app, ["report", str(folder), "--no-png"])
    assert result.exit_code == 0, result.output
    assert "x.y" in (folder / "index.html").read_text()  # shown under its own name


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_outputs_get_the_modes_the_umask_gives(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY + "\n[sweep]\nrates = [1]\nreplications = 1\n")
    out = tmp_path / "out"
    old = os.umask(umask)
    try:
        assert runner.invoke(app, ["run", str(path), "--out", str(out)]).exit_code == 0
        sweep.run_sweep(path, jobs=1, out=out)
        assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    finally:
        os.umask(old)
    found = modes(out)
    assert any(name.endswith("points") for name in found) and "charts/latency_cdf.png" in found
    for name, mode in found.items():
        expected = (0o777 if (out / name).is_dir() else 0o666) & ~umask
        assert mode == expected, f"{name}: {oct(mode)} (expected {oct(expected)})"


# --- output paths that cannot be written: one `error:` line, exit 2, before any work ------------------

QUICK = TINY.replace("duration_s = 10", "duration_s = 1") + "\n[sweep]\nrates = [1]\nreplications = 1\n"
REPLAY_TRACE = '[{"id": "r0", "arrival_step": 0, "prompt_len": 8, "max_tokens": 2}]'


def _symlink_loop(root: Path) -> str:
    (root / "loop").symlink_to("loop")
    return str(root / "loop")


def _dangling_symlink(root: Path) -> str:
    (root / "dangling").symlink_to(root / "missing" / "x")
    return str(root / "dangling")


def _file_in_the_way(root: Path) -> str:
    (root / "plain").write_text("")
    return str(root / "plain" / "sub")


BAD_OUTPUTS = {
    "symlink loop": (_symlink_loop, "loops"),
    "inside a symlink loop": (lambda root: _symlink_loop(root) + "/sub", "loops"),
    "dangling symlink": (_dangling_symlink, "does not exist"),
    "inside a dangling symlink": (lambda root: _dangling_symlink(root) + "/sub", "does not exist"),
    "5000-character path": (lambda root: str(root / ("a/" * 2500)), "too long"),
    "300-character name": (lambda root: str(root / ("b" * 300)), "at most 255"),
    "file in the way": (_file_in_the_way, "file"),
    "empty": (lambda root: "", "empty"),
}
OUTPUT_COMMANDS = {
    "run --out": lambda out: ["run", "quick.toml", "--out", out],
    "sweep --out": lambda out: ["sweep", "quick.toml", "--jobs", "1", "--out", out],
    "plan --out": lambda out: ["plan", "quick.toml", "--rate", "1", "--out", out],
    "validate --out": lambda out: ["validate", "ground-truth", "--out", out],
    "calibrate --write": lambda out: ["calibrate", "--write", out],
    "kernels --write": lambda out: ["kernels", "--write", out],
    "replay-steps --out": lambda out: ["replay-steps", "trace.json", "--out", out],
    "report DIR": lambda out: ["report", out],
}


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`sim ARGS` as the console command runs it: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    captured = capsys.readouterr()
    return stop.value.code if isinstance(stop.value.code, int) else 0, captured.out, captured.err


@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
@pytest.mark.parametrize("kind", BAD_OUTPUTS)
def test_an_output_path_that_cannot_be_written_is_one_error_line_naming_it_and_why(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], kind: str, command: str
) -> None:
    """Symlink loops, dangling links, over-long paths and names, a file in the way and the empty path are
    refused by every command that writes, before it starts: exit 2, one `error:` line with the reason, the
    path shown (shortened when long), nothing written."""
    (in_tmp / "quick.toml").write_text(QUICK)
    (in_tmp / "trace.json").write_text(REPLAY_TRACE)
    make, reason = BAD_OUTPUTS[kind]
    out = make(in_tmp)
    before = files_under(in_tmp)
    code, stdout, stderr = run_main(OUTPUT_COMMANDS[command](out), capsys)
    assert code == 2 and "Traceback" not in stdout + stderr, (code, stdout, stderr)
    (line,) = stderr.splitlines()
    assert line.startswith("error: ") and reason in line and len(line) < 400, line
    if out:
        assert str(out)[:20] in line, line
    assert files_under(in_tmp) == before


@pytest.mark.parametrize("blocker", ["index.html", "charts", "charts/latency_cdf.png"])
def test_a_report_file_that_cannot_be_written_is_one_error_line_naming_it(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], blocker: str
) -> None:
    """A folder named index.html (or a chart's PNG), or a file named charts, makes `sim report` exit 2
    with one `error:` line naming that path; no temporary file is left behind."""
    (in_tmp / "quick.toml").write_text(QUICK)
    code, _, stderr = run_main(["run", "quick.toml", "--out", "out", "--policy", "static"], capsys)
    assert code == 0, stderr
    in_the_way = in_tmp / "out" / blocker
    if blocker == "charts":
        in_the_way.write_text("")
    else:
        in_the_way.mkdir(parents=True)
    before = files_under(in_tmp)
    code, stdout, stderr = run_main(["report", "out"], capsys)
    assert code == 2 and "Traceback" not in stdout + stderr, (code, stdout, stderr)
    (line,) = stderr.splitlines()
    assert line.startswith("error: ") and str(Path("out") / blocker) in line, line
    assert not [p.name for p in files_under(in_tmp) - before if p.name.startswith(".")]

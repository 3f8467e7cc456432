"""A disk that fills up while `sim run` or `sim sweep` writes under `--out`: one `error:` line naming the
folder, exit 2, no traceback, the previous results byte-identical and no temporary left behind. The full
disk is simulated by making a write fail part-way, in the forms the system and polars report it."""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from test_manifest import TINY

from sim.cli import main
from sim.io.outputs import DiskFull, disk_full_reason

SCENARIO = TINY.replace("duration_s = 10", "duration_s = 4") + "\n[sweep]\nrates = [1, 2]\nreplications = 1\n"


def files(out: Path) -> dict[str, bytes]:
    """Every file and folder under `out` (hidden ones included), with a file's bytes."""
    return {str(p.relative_to(out)): p.read_bytes() if p.is_file() else b"" for p in sorted(out.rglob("*"))}


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return int(exit_info.value.code or 0), capsys.readouterr().err


def system_full(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def polars_full(self: Any, file: Any, *args: Any, **kwargs: Any) -> None:
    """polars' own report of a full disk (a ComputeError, no errno), after part of the file is written."""
    Path(file).write_bytes(b"PAR1 partial")
    raise pl.exceptions.ComputeError(
        "parquet: File out of specification: underlying IO error: No space left on device (os error 28)"
    )


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO)
    return path


def check_refused(code: int, err: str, folder: Path) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(folder) in lines[0] and "the disk is full (No space left on device)" in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("target", "attribute", "replacement"),
    [
        (pl.DataFrame, "write_parquet", polars_full),  # the records, streamed as the run goes
        (pl.LazyFrame, "sink_parquet", polars_full),  # the records joined at the end
        (Path, "write_text", system_full),  # summary.json, manifest.json
    ],
)
def test_sim_run_on_a_full_disk_exits_2_and_leaves_the_previous_run(
    scenario: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    target: Any,
    attribute: str,
    replacement: Any,
) -> None:
    out = tmp_path / "out"
    assert run_cli(["run", str(scenario), "--out", str(out)], capsys)[0] == 0
    before = files(out)
    monkeypatch.setattr(target, attribute, replacement)
    code, err = run_cli(["run", str(scenario), "--out", str(out)], capsys)
    check_refused(code, err, out / "static")
    assert files(out) == before  # byte-identical, and no temporary file or folder left


def test_sim_run_into_a_new_folder_on_a_full_disk_leaves_nothing(
    scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pl.DataFrame, "write_parquet", polars_full)
    out = tmp_path / "new" / "out"
    code, err = run_cli(["run", str(scenario), "--out", str(out)], capsys)
    check_refused(code, err, out / "static")
    assert not (tmp_path / "new").exists()


def test_sim_sweep_on_a_full_disk_exits_2_and_leaves_the_previous_points(
    scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    sweep = ["sweep", str(scenario), "--jobs", "1", "--out", str(out)]
    assert run_cli(sweep, capsys)[0] == 0
    before = files(out)

    # A new rate's first point file fails part-way: the finished points and the aggregate stay as they
    # were (the manifest, which names the new sweep table, is rewritten whole before any point runs).
    monkeypatch.setattr(pl.DataFrame, "write_parquet", polars_full)
    code, err = run_cli([*sweep, "--set", "sweep.rates=[1, 2, 4]"], capsys)
    check_refused(code, err, out / "sweep" / "points")
    after = files(out)
    assert after.pop("sweep/manifest.json") != before["sweep/manifest.json"]
    assert after == {k: v for k, v in before.items() if k != "sweep/manifest.json"}

    # The same sweep again, every point done: the aggregate's write fails, the old one stays.
    monkeypatch.setattr(Path, "write_text", system_full)  # the manifest, first
    code, err = run_cli(sweep, capsys)
    check_refused(code, err, out / "sweep")
    monkeypatch.undo()
    assert run_cli(sweep, capsys)[0] == 0  # the manifest as it was
    assert files(out) == before
    monkeypatch.setattr(pl.DataFrame, "write_parquet", polars_full)
    code, err = run_cli(sweep, capsys)
    check_refused(code, err, out / "sweep")
    assert files(out) == before


def test_a_full_disk_as_reported_by_the_system_and_by_polars() -> None:
    assert disk_full_reason(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    assert disk_full_reason(OSError(errno.EDQUOT, "Disk quota exceeded")) == "Disk quota exceeded"
    assert disk_full_reason(pl.exceptions.ComputeError("IO error: ... (os error 28)")) == os.strerror(28)
    assert disk_full_reason(OSError("disk full")) is None  # no errno: not the system's report
    assert disk_full_reason(OSError(errno.EACCES, "Permission denied")) is None
    error = pickle.loads(pickle.dumps(DiskFull(Path("out"), "No space left on device")))
    assert isinstance(error, DiskFull) and str(error).startswith("cannot write into out: the disk is full")

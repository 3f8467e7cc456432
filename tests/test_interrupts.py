"""An interrupted `sim sweep` (SIGTERM, or SIGINT as Ctrl-C sends it) exits through Python, ends every
process it started, and a re-run finishes with files byte-identical to those of an uninterrupted sweep, on
the process pool and on a dask cluster. Every wait is bounded: a sweep that does not stop is killed and the
test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_manifest import TINY

from sim.studies import sweep

# 32 points of a few tenths of a second each: two workers are busy for several seconds after the first
# point file appears, so the signal always falls in the middle of the sweep.
SCENARIO = TINY.replace("duration_s = 10", "duration_s = 20") + (
    "\n[sweep]\nrates = [1, 2, 4, 8]\nreplications = 4\n"
)
MARK = "SERVESIM_INTERRUPT_TEST"  # in the environment of the sweep and of everything it starts
START_S = 120.0  # for the first point file (the process pool starts its workers first)
EXIT_S = 30.0  # for the sweep to exit after the signal
GONE_S = 3.0  # for every process it started to be gone after it exited
RESUME_S = 300.0  # for the re-run to finish the sweep


def sweep_files(out: Path) -> dict[str, bytes]:
    """Every file a sweep leaves under `out/sweep` (hidden ones included), by path, with its bytes."""
    root = out / "sweep"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "interrupt.toml"
    path.write_text(SCENARIO)
    return path


@pytest.fixture(scope="module")
def uninterrupted(scenario: Path) -> dict[str, bytes]:
    out = scenario.parent / "uninterrupted"
    sweep.run_sweep(scenario, jobs=1, out=out)
    return sweep_files(out)


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    distributed = pytest.importorskip("dask.distributed")  # in the dev extra; skipped only without it
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://", dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


def started_by(marker: str) -> list[psutil.Process]:
    """Live processes whose environment carries `marker`: the sweep and whatever it started, however
    deep, even once they are re-parented."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_for_points(proc: subprocess.Popen[bytes], points: Path) -> None:
    deadline = time.monotonic() + START_S
    while not (points.is_dir() and any(points.glob("*.parquet"))):
        assert proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before its first point"
        assert time.monotonic() < deadline, f"no point file after {START_S:.0f} s"
        time.sleep(0.05)


def wait_until_gone(marker: str) -> list[psutil.Process]:
    deadline = time.monotonic() + GONE_S
    while (alive := started_by(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("executor", ["process", "dask"])
def test_an_interrupted_sweep_leaves_no_process_and_resumes_to_identical_files(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    scenario: Path,
    uninterrupted: dict[str, bytes],
    executor: str,
    signum: signal.Signals,
) -> None:
    """The signal arrives while points run on two workers. The sweep exits with 128 + the signal's number,
    no traceback; within a few seconds no process it started is alive (the process pool's workers, its
    fork server and resource tracker included); the re-run resumes and leaves exactly the files, byte for
    byte, of a sweep that was never interrupted."""
    out = tmp_path / "out"
    args = [sys.executable, "-m", "sim", "sweep", str(scenario), "--jobs", "2", "--out", str(out)]
    address = None
    if executor == "dask":
        address = request.getfixturevalue("dask_address")
        args += ["--executor", "dask", "--address", address]
    marker = uuid.uuid4().hex
    log = tmp_path / "stderr.txt"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, MARK: marker}
        )
    try:
        wait_for_points(proc, out / "sweep" / "points")
        proc.send_signal(signum)
        try:
            code = proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the sweep was still running {EXIT_S:.0f} s after {signum.name}")
        alive = wait_until_gone(marker)
        assert not alive, [(p.pid, " ".join(p.cmdline())[:80]) for p in alive]
    finally:
        for leftover in started_by(marker):
            leftover.kill()
    text = log.read_text()
    assert code == 128 + signum, (code, text)
    assert "Traceback" not in text, text
    assert sweep_files(out) != uninterrupted  # the sweep was stopped before its end
    # The same command again, as a user resumes; in a process of its own, so that its pool does not share
    # the test's process with the in-process dask cluster's threads.
    resumed = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RESUME_S)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert sweep_files(out) == uninterrupted


def test_stopping_a_pool_leaves_no_manager_thread_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """After `stop_workers` the pool's manager thread has ended, so the interpreter's exit hook cannot write
    to its wake-up pipe while that thread closes it (Python 3.11 prints the EBADF as a traceback). The
    thread is made slow to close its pipe, as on a loaded machine."""
    import concurrent.futures.process as cfp
    import multiprocessing
    import time

    from sim.studies.executor import stop_workers

    closing = cfp._ExecutorManagerThread.join_executor_internals

    def slow_close(self: object) -> None:
        time.sleep(0.5)
        closing(self)  # type: ignore[arg-type]

    monkeypatch.setattr(cfp._ExecutorManagerThread, "join_executor_internals", slow_close)
    pool = cfp.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("forkserver"))
    futures = [pool.submit(time.sleep, 30) for _ in range(4)]
    while not any(f.running() for f in futures):
        time.sleep(0.01)
    manager = pool._executor_manager_thread
    assert manager is not None
    stop_workers(pool)
    assert not manager.is_alive()

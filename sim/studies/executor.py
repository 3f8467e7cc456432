"""Running independent tasks: in this process, a process pool, or a Dask cluster; results in task order."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sim.io.errors import SimError
from sim.io.outputs import on_interrupt
from sim.studies.points import Task, run_point, write_point


def check_executor(kind: str, address: str | None) -> None:
    """SimError for an --address the executor would not use (only a dask scheduler has one)."""
    if address is not None and kind == "process":
        raise SimError(
            f"--address {address} goes with --executor dask; the process executor runs the points on "
            "this machine (add --executor dask, or drop --address)"
        )


# Loggers that print a traceback for each connection a stopped client drops (tornado's callback errors,
# distributed's comm errors): after an interrupt the user asked for, those are not errors to show.
DASK_TEARDOWN_LOGGERS = ("tornado.application", "distributed", "asyncio")


def quiet_dask_teardown() -> None:
    """Silence the loggers that print a traceback for each connection a stopped dask client drops."""
    for name in DASK_TEARDOWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


@contextmanager
def open_executor(kind: str, jobs: int, address: str | None) -> Iterator[Executor | None]:
    """A `concurrent.futures.Executor` for the points; None means run them in-process, one by one."""
    check_executor(kind, address)
    if kind == "dask":
        if address is None:
            raise SimError("--executor dask needs --address tcp://HOST:PORT (a dask scheduler)")
        try:
            from dask.distributed import Client
        except ImportError:
            raise SimError(
                "--executor dask needs dask.distributed: pip install 'servesim[cluster]'"
            ) from None
        try:
            client = Client(address, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise SimError(f"--address {address}: cannot reach a dask scheduler ({err})") from None
        except ValueError as err:
            raise SimError(f"--address {address}: not a dask scheduler address ({err})") from None
        try:
            with on_interrupt(quiet_dask_teardown):  # quiet before the futures are cancelled, not after
                yield client.get_executor()
        except BaseException:  # interrupted: the connections close mid-message, which is expected now
            quiet_dask_teardown()
            raise
        finally:
            client.close()
    elif kind == "process":
        if jobs < 1:
            raise SimError(f"--jobs: give at least 1 (got {jobs})")
        if jobs == 1:
            yield None
            return
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["sim.studies.sweep"])
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
        try:
            yield pool
        except BaseException:
            stop_workers(pool)
            raise
        pool.shutdown(wait=True)
    else:
        raise SimError(f"--executor: unknown executor {kind!r} (process or dask)")


def stop_workers(pool: ProcessPoolExecutor, grace_s: float = 2.0) -> None:
    """End a pool at once, for an error or an interrupt (SIGTERM, Ctrl-C): queued tasks are dropped and
    every worker is terminated (killed if it has not stopped within `grace_s`), so that none outlives the
    command, however long its current task would have run."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before 3.14
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(grace_s)
        if worker.is_alive():
            worker.kill()
            worker.join(grace_s)
    # The pool's manager thread sees its workers gone and closes its wake-up pipe; waiting for it here
    # keeps the interpreter's exit hook from writing to that pipe while it closes (an EBADF traceback
    # printed as the command exits).
    if manager is not None and manager.is_alive():
        manager.join(grace_s)


def execute(
    tasks: Sequence[Task],
    executor: Executor | None,
    points_dir: Path,
    advance: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Run `tasks`, writing each row as soon as it is back; on a failure, cancel the rest and re-raise."""
    rows: list[dict[str, Any]] = []
    if executor is None:
        for task in tasks:
            rows.append(run_point(task))
            write_point(points_dir, rows[-1])
            advance()
        return rows
    futures = [executor.submit(run_point, task) for task in tasks]
    try:
        for fut in as_completed(futures):
            rows.append(fut.result())
            write_point(points_dir, rows[-1])
            advance()
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return rows

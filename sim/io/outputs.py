"""Output files and folders: safe names, atomic writes with the normal umask, folders swapped in whole.

A name taken from a scenario (its `name`, a policy table's name) becomes one path component through
`path_component`, so that nothing is ever written outside the output folder. Files are written to a
temporary sibling and renamed into place (`atomic_write`); a run's folder is filled beside its target and
swapped in with two renames (`replace_folder`), so a killed run leaves the previous results or none, never
a mix. Both create files and folders with the modes the process's umask gives (like `open` and `mkdir`).
A full disk (or quota) while either writes is a `DiskFull` error naming the folder, with the temporaries
removed and the files already in place left whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sim.io.errors import SimError
from sim.io.paths import shown

SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_COMPONENT = 100  # characters kept from a name before its hash suffix


def path_component(name: str, reserved: frozenset[str] = frozenset()) -> str:
    """`name` as one safe file or folder name: itself when it is made of letters, digits, `_ . -` and is
    not `.`, `..` or a `reserved` name; else those characters kept (others become `-`) plus a short hash
    of the name, so distinct names never share a folder."""
    safe = "".join(c if c in SAFE_CHARS else "-" for c in name)[:MAX_COMPONENT]
    if safe == name and name.strip(".") and name not in reserved:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{safe.replace('.', '-') if not safe.strip('.') else safe}-{digest}"


# A temporary sibling of what is being written: `.NAME.KIND-PID-XXXXXXXX`, KIND one of tmp (a file being
# written), new (a run folder being made), old (one being replaced), PID the writing process.
LEFTOVER = re.compile(r"^\..+\.(?:tmp|new|old)-(\d+)-[0-9a-f]{8}$")


def _temp_name(path: Path, kind: str) -> Path:
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or a pid this platform cannot ask about: assume alive
        return True
    return True


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files and folders in `folder` whose writer is no longer running (a killed
    `sim run` or `sim sweep`: SIGKILL runs no clean-up); a write in progress is left alone. Returns what
    was removed."""
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = LEFTOVER.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def create_file(path: Path) -> None:
    """Create an empty file that must not exist yet, with mode 0666 less the umask (as `open` would)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


# The system's "no space left" and "quota exceeded"; polars' writers report them only in their message.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_MARKS = tuple(f"(os error {code})" for code in sorted(DISK_FULL_ERRNOS))


class DiskFull(SimError):
    """The disk (or the user's quota) filled up while writing into `folder`."""

    def __init__(self, folder: Path, reason: str) -> None:
        self.folder, self.reason = folder, reason
        super().__init__(
            f"cannot write into {shown(folder)}: the disk is full ({reason}); nothing was left half-written"
            " and the files already there are whole; free some space and run again"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a sweep's worker process, re-raised in the parent
        return (DiskFull, (self.folder, self.reason))


def disk_full_reason(exc: BaseException) -> str | None:
    """Why `exc` says the disk is full (`No space left on device`, `Disk quota exceeded`), or None when it
    does not: an OSError with that errno, or an error (polars') whose message carries the system's code."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return exc.strerror or os.strerror(exc.errno)
    text = str(exc)
    for code, mark in zip(sorted(DISK_FULL_ERRNOS), DISK_FULL_MARKS, strict=True):
        if mark in text:
            return os.strerror(code)
    return None


@contextmanager
def disk_full_as_error(folder: Path) -> Iterator[None]:
    """A disk-full error of any kind in the block becomes `DiskFull(folder)`; other errors pass on."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        if (reason := disk_full_reason(exc)) is None:
            raise
        raise DiskFull(folder, reason) from None


@contextmanager
def writing(path: Path, folder: Path | None = None) -> Iterator[None]:
    """An OSError in the block (a folder where the file goes, a name too long, no permission) becomes a
    SimError naming `path` and the reason (`DiskFull` naming `folder`, by default the one holding `path`,
    when the disk is full)."""
    try:
        with disk_full_as_error(path.parent if folder is None else folder):
            yield
    except OSError as exc:
        raise SimError(f"cannot write {shown(path)}: {exc.strerror or exc}") from None


def atomic_write(path: Path, write: Callable[[str], Any]) -> None:
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it into place (normal file mode).
    Making the folder, the temporary file, writing it or the rename failing with an OSError is a SimError
    naming `path` (`DiskFull` when the disk is full, whoever reports it); other errors that `write` raises
    are passed on as they are. The temporary file is removed in every case."""
    tmp = _temp_name(path, "tmp")
    with _interrupts_held(), contextlib.ExitStack() as cleanup:
        cleanup.callback(_unlink_missing_ok, tmp)  # an error at any point leaves no file behind
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            create_file(tmp)
            write(str(tmp))
            os.replace(tmp, path)


def _unlink_missing_ok(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))


@contextmanager
def replace_folder(target: Path, is_ours: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `target`; when the block ends without an error, it becomes
    `target`. An existing `target` is replaced only when `is_ours(target)` (else SimError, nothing
    written); on an error or an interrupt the temporary folder is removed and `target` is left as it was.
    The disk filling up at any point, in the block included, is `DiskFull` naming `target`."""
    if target.exists() and not (target.is_dir() and is_ours(target)):
        raise SimError(f"{target}: exists and is not one of our output folders; give another --out")
    tmp = _temp_name(target, "new")
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(target.parent)
    try:  # the temporary is made inside: an interrupt at any point leaves no folder behind
        with writing(target, target):
            tmp.mkdir()
        with disk_full_as_error(target):
            yield tmp
        with writing(target, target):
            _swap_in(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(new: Path, target: Path) -> None:
    """Rename `new` to `target`, the previous `target` moved aside first and put back should that fail."""
    if not target.exists():
        os.rename(new, target)
        return
    old = _temp_name(target, "old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def exit_on_terminate() -> Iterator[None]:
    """While the block runs, SIGTERM (`kill PID`) exits through Python (SystemExit 143) instead of stopping
    the process dead, so that `finally` clauses, such as `replace_folder`'s clean-up, still run; SIGTERM and
    Ctrl-C (SIGINT, KeyboardInterrupt) that arrive while a file is put in place (`atomic_write`) are raised
    once it is, never inside the library writing it (which would turn them into its own errors)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        for hook in list(_ON_INTERRUPT):
            hook()
        if _HELD["depth"]:
            _HELD["pending"] = signum
            return
        _raise_interrupt(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# What runs the moment SIGTERM or Ctrl-C arrives, before the exit unwinds (`on_interrupt`).
_ON_INTERRUPT: list[Callable[[], None]] = []


@contextlib.contextmanager
def on_interrupt(hook: Callable[[], None]) -> Iterator[None]:
    """While the block runs, `hook()` is called as soon as an interrupt arrives under `exit_on_terminate`,
    before anything unwinds: for work on other threads that the unwinding disturbs (a dask client's
    connections, whose loop thread would log each dropped one)."""
    _ON_INTERRUPT.append(hook)
    try:
        yield
    finally:
        _ON_INTERRUPT.remove(hook)


# Interrupts held while a file is put in place: how deep the writes nest, and the signal that came meanwhile.
_HELD: dict[str, Any] = {"depth": 0, "pending": None}


def _raise_interrupt(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold `exit_on_terminate`'s interrupts until the block ends, then raise the one that came."""
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        signum, _HELD["pending"] = _HELD["pending"], None
        if not _HELD["depth"] and signum is not None:
            _raise_interrupt(signum)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as `{dotted.key: leaf}` (lists are leaves)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(dotted key, value in a, value in b)` for every leaf that differs (None where a side lacks it)."""
    fa, fb = flatten(a), flatten(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]

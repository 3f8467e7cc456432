"""Reading CSV and JSON-lines data files (traces, empirical lengths) into numeric columns.

Errors name the file, the column and the line, and never quote the file's contents: a path given by
mistake (a key file, a password store) must not have its first entry echoed to the terminal or a log.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from sim.io.errors import SimError

_NOT_A_NUMBER = "?"  # stands for a JSON value that is no number (true, a list, an object)


@dataclass(frozen=True)
class Table:
    """A data file's columns, all read as text (null where empty), and each row's line in the file."""

    path: Path
    frame: pl.DataFrame
    lines: np.ndarray

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)

    def __len__(self) -> int:
        return self.frame.height

    def numbers(self, column: str) -> np.ndarray:
        """A column as finite float64 values; SimError naming the file, column and first bad line."""
        text = self.frame[column]
        values = text.cast(pl.Float64, strict=False)
        bad = (values.is_null() | ~values.is_finite()).to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            what = "empty" if text[row] is None else "not a finite number"
            raise SimError(f"{self.path}: line {int(self.lines[row])}: column {column!r}: {what}")
        return values.to_numpy().astype(np.float64)


def _decoded(path: Path, data: bytes) -> bytes:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error):
            raise SimError(f"{path}: a cut or damaged gzip file") from None
    if b"\x00" in data[:65536]:
        raise SimError(f"{path}: a binary file, not CSV or JSON lines")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SimError(f"{path}: not a UTF-8 text file (bad byte at offset {err.start})") from None
    return data


def _csv(path: Path, data: bytes) -> Table:
    try:
        frame = pl.read_csv(io.BytesIO(data), infer_schema=False)
    except pl.exceptions.NoDataError:
        raise SimError(f"{path}: empty file") from None
    except Exception:  # polars raises several error types, whose messages quote the file
        raise SimError(
            f"{path}: cannot read as CSV (rows of unequal width, bad quoting or a repeated column name)"
        ) from None
    header = next(csv.reader(io.StringIO(data[:65536].decode("utf-8", errors="ignore"))), [])
    repeated = sorted({name for name in header if name and header.count(name) > 1})
    if repeated:  # polars keeps the first and renames the others, so one of them would go unread
        raise SimError(f"{path}: line 1: column {repeated[0]!r} appears more than once")
    return Table(path, frame, np.arange(frame.height, dtype=np.int64) + 2)  # line 1 is the header


def _jsonl(path: Path, data: bytes) -> Table:
    rows: list[dict[str, str | None]] = []
    lines: list[int] = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise SimError(f"{path}: line {number}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise SimError(f"{path}: line {number}: not a JSON object")
        rows.append({str(k): _as_text(v) for k, v in obj.items()})
        lines.append(number)
    if not rows:
        raise SimError(f"{path}: empty file")
    names = list(dict.fromkeys(k for row in rows for k in row))
    frame = pl.DataFrame(
        {k: [row.get(k) for row in rows] for k in names}, schema=dict.fromkeys(names, pl.String)
    )
    return Table(path, frame, np.asarray(lines, dtype=np.int64))


def _as_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return _NOT_A_NUMBER
    return str(value)


def read_table(path: Path, fmt: str | None = None) -> Table:
    """Read a CSV or JSON-lines file (`fmt`, else by suffix; gzip allowed); SimError if unreadable."""
    if not path.exists():
        raise SimError(f"{path}: file not found")
    if not path.is_file():
        raise SimError(f"{path}: not a regular file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SimError(f"{path}: cannot read: {err.strerror or type(err).__name__}") from None
    data = _decoded(path, data)
    if fmt is None:
        suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
        fmt = "jsonl" if suffixes and suffixes[-1] in (".jsonl", ".ndjson", ".json") else "csv"
    return _jsonl(path, data) if fmt == "jsonl" else _csv(path, data)


def read_column(path: Path, column: str, low: float | None = None) -> np.ndarray:
    """One numeric column of a CSV / JSON-lines file as float64 (at least one value, each >= `low` if
    given), with SimErrors naming file, column and line."""
    table = read_table(path)
    if column not in table.columns:
        raise SimError(f"{path}: no column {column!r}")
    if len(table) == 0:
        raise SimError(f"{path}: column {column!r} has no values")
    values = table.numbers(column)
    if low is not None and (values < low).any():
        line = int(table.lines[int(np.argmax(values < low))])
        raise SimError(f"{path}: line {line}: column {column!r}: expected a number >= {low:g}")
    return values

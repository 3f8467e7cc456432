"""Where a run's record chunks go: kept in memory, or written to Parquet as the run goes.

The recorder hands over its records in chunks (frames of at most `Recorder.chunk_rows` rows, in their final
order) under a name, `requests` or `steps`. `MemorySink` keeps them and concatenates them at the end;
`ParquetSink` holds the first chunk; from the second on it writes each chunk, uncompressed, to its own part
file in a hidden folder and, at `finish`, makes `<folder>/<name>.parquet` out of them, joined by polars'
streaming engine (which never holds more than a few row groups, and compresses as `write_parquet` does).
A run that fits in one chunk writes that chunk as the file, exactly the file a frame's `write_parquet` writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

import polars as pl

PARTS = ".parts"  # the hidden folder of part files, under the sink's folder


class RecordSink(Protocol):
    def write(self, name: str, chunk: pl.DataFrame) -> None:
        """Take the next chunk of `name`'s records."""
        ...

    def finish(self, name: str, sort_by: str | None = None) -> None:
        """No more chunks of `name`; `sort_by`: the chunks were not written in that column's order."""
        ...

    def lazy(self, name: str) -> pl.LazyFrame:
        """`name`'s records so far (after `finish`: all of them, in their final order)."""
        ...


class MemorySink:
    """Keeps the chunks as frames (small runs, sweeps, tests)."""

    def __init__(self) -> None:
        self._chunks: dict[str, list[pl.DataFrame]] = {}
        self._frames: dict[str, pl.DataFrame] = {}

    def write(self, name: str, chunk: pl.DataFrame) -> None:
        self._chunks.setdefault(name, []).append(chunk)

    def finish(self, name: str, sort_by: str | None = None) -> None:
        frame = self.frame(name)
        self._frames[name] = frame.sort(sort_by) if sort_by is not None else frame

    def frame(self, name: str) -> pl.DataFrame:
        if name in self._frames:
            return self._frames[name]
        chunks = self._chunks.get(name, [])
        if not chunks:
            raise ValueError(f"no {name} records")
        return chunks[0] if len(chunks) == 1 else pl.concat(chunks, rechunk=True)

    def lazy(self, name: str) -> pl.LazyFrame:
        return self.frame(name).lazy()


class ParquetSink:
    """Writes `<folder>/<name>.parquet` (without statistics, as `write_result` does) chunk by chunk."""

    def __init__(self, folder: Path, row_group_rows: int = 1 << 16) -> None:
        self.folder = folder
        self.row_group_rows = row_group_rows  # of the joined file, so a reader holds one group at a time
        self._first: dict[str, pl.DataFrame] = {}  # a name's first chunk, until a second comes
        self._parts: dict[str, list[Path]] = {}
        self._done: set[str] = set()

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.parquet"

    def write(self, name: str, chunk: pl.DataFrame) -> None:
        if name not in self._first and name not in self._parts:
            self._first[name] = chunk
            return
        first = self._first.pop(name, None)
        if first is not None:
            self._write_part(name, first)
        self._write_part(name, chunk)

    def _write_part(self, name: str, chunk: pl.DataFrame) -> None:
        """A chunk to be joined: uncompressed, so that writing and reading it back cost least."""
        parts = self._parts.setdefault(name, [])
        part = self.folder / PARTS / f"{name}-{len(parts):06d}.parquet"
        part.parent.mkdir(exist_ok=True)
        chunk.write_parquet(part, compression="uncompressed", statistics=False)
        parts.append(part)

    def finish(self, name: str, sort_by: str | None = None) -> None:
        target = self.path(name)
        first = self._first.pop(name, None)
        if first is not None and sort_by is None:
            first.write_parquet(target, statistics=False)
        else:
            if first is not None:
                self._write_part(name, first)
            scan = pl.scan_parquet(self._parts.get(name, []))
            if sort_by is not None:  # ids out of arrival order: a sort, which holds the column in memory
                scan = scan.sort(sort_by)
            scan.sink_parquet(target, statistics=False, row_group_size=self.row_group_rows)
        self._done.add(name)
        if not self._first and self._done >= set(self._parts):
            shutil.rmtree(self.folder / PARTS, ignore_errors=True)

    def lazy(self, name: str) -> pl.LazyFrame:
        if name in self._done:
            return pl.scan_parquet(self.path(name))
        if name in self._first:
            return self._first[name].lazy()
        return pl.scan_parquet(self._parts[name])

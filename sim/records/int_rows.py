"""Fixed-width integer record rows in one flat buffer (the recorder's step and request columns)."""

from __future__ import annotations

from array import array

import numpy as np


class IntRows:
    """Fixed-width integer rows in one flat buffer: 32-bit until a value needs 64."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.data = array("i")

    def _widen(self) -> None:
        """Move to 64-bit rows, after a value did not fit in 32 bits (one that does not fit in 64 raises)."""
        if self.data.typecode == "q":
            raise OverflowError("an integer record value does not fit in 64 bits")
        self.data = array("q", self.data)

    def extend(self, values: tuple[int, ...]) -> None:
        size = len(self.data)
        try:
            self.data.extend(values)
        except OverflowError:
            del self.data[size:]  # a tuple is appended item by item: drop the part that fitted
            self._widen()
            self.data.extend(values)

    def repeat(self, row: list[int], times: int, column: int, first: int, step: int) -> None:
        """`times` copies of `row`, with `column` counting from `first` by `step` (0: as in `row`), built as
        one array: a quiet run's steps."""
        code = self.data.typecode
        try:
            block = array(code, row) * times
            if step:
                block[column :: self.width] = array(code, range(first, first + times * step, step))
        except OverflowError:
            self._widen()
            self.repeat(row, times, column, first, step)
            return
        self.data.extend(block)

    def set_column(self, column: int, values: list[int]) -> None:
        """Set `column` of the last `len(values)` rows to `values`."""
        at = len(self.data) - len(values) * self.width + column
        try:
            self.data[at :: self.width] = array(self.data.typecode, values)
        except OverflowError:
            self._widen()
            self.set_column(column, values)

    def columns(self) -> np.ndarray:
        """A (columns, rows) int64 array."""
        flat = np.frombuffer(self.data, dtype=np.int32 if self.data.typecode == "i" else np.int64)
        return flat.reshape(-1, self.width).T.astype(np.int64, order="C")

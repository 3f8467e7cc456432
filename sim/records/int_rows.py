"""Fixed-width integer record rows in one flat buffer (the recorder's step and request columns)."""

from __future__ import annotations

from array import array

import numpy as np


class IntRows:
    """Fixed-width integer rows in one flat buffer: 32-bit until a value needs 64."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.data = array("i")

    def widen(self) -> None:
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
            self.widen()
            self.data.extend(values)

    def columns(self) -> np.ndarray:
        """A (columns, rows) int64 array."""
        flat = np.frombuffer(self.data, dtype=np.int32 if self.data.typecode == "i" else np.int64)
        return flat.reshape(-1, self.width).T.astype(np.int64, order="C")

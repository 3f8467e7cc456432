"""Fixed-width integer record rows in one flat buffer (the recorder's step and request columns)."""

from __future__ import annotations

from array import array

import numpy as np


class IntRows:
    """Fixed-width integer rows in one flat buffer: 32-bit until a value needs 64."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.data = array("i")

    def extend(self, values: tuple[int, ...]) -> None:
        size = len(self.data)
        try:
            self.data.extend(values)
        except OverflowError:
            del self.data[size:]  # a tuple is appended item by item: drop the part that fitted
            if self.data.typecode == "q":
                raise
            self.data = array("q", self.data)
            self.data.extend(values)

    def columns(self) -> np.ndarray:
        """A (columns, rows) int64 array."""
        flat = np.frombuffer(self.data, dtype=np.int32 if self.data.typecode == "i" else np.int64)
        return flat.reshape(-1, self.width).T.astype(np.int64, order="C")

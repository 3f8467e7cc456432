"""S-LoRA's unified memory pool: KV cache and adapter weights in one pool of cells.

S-LoRA (Sheng et al., MLSys'24; S-LoRA/S-LoRA at c1ddf48) keeps one pool of `max_total_token_num` cells,
each one token's K and V over every layer (`slora/common/mem_manager.py`, `MemoryManager`: a key and a value
buffer of `size x heads x head_dim` per layer). A request's KV takes a cell per token: its prompt at its
prefill, one more at each decode. An adapter of rank r on q/k/v/o takes 4r cells: its four A matrices' rows
in the key buffers and its four B matrices' in the value buffers (`slora/server/router/model_infer/
infer_adapter.py`, `load_lora_A`/`load_lora_B` lines 43-89, `a_len = r * 4` line 142). Here an adapter takes
its bytes over a cell's bytes, rounded up: 4r for a model whose K and V widths are its hidden size.

An adapter is loaded when an admitted request needs it and it is not resident (`load_adapters`, lines
92-171), and dropped when a decode step finishes a request and no running request uses it any more, or when
the running batch empties (`offload_adapters`, lines 186-254; `slora/server/router/manager.py` lines
306-339). The adapters the latest prefetch named are kept by an offload that keeps any (their `prefetch_tag`,
lines 99-114 and 207-209).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class AdapterPool:
    """Cells held by KV and by resident adapters; which adapters are resident."""

    def __init__(self, cells: int, adapter_cells: Callable[[int], int]) -> None:
        self.capacity = cells
        self.adapter_cells = adapter_cells
        self.kv = 0  # cells holding token states
        self.resident: dict[int, int] = {}  # adapter -> its cells, in load order
        self.adapters = 0  # cells holding adapters
        self.prefetched: set[int] = set()  # loaded ahead: kept through the next offload

    @property
    def free(self) -> int:
        return self.capacity - self.kv - self.adapters

    def load(self, adapters: Iterable[int], prefetch: bool = False) -> list[int]:
        """Make `adapters` resident; those it had to load. A prefetch loads only what fits (lines 101-111)."""
        loaded: list[int] = []
        named: set[int] = set()  # a prefetch tags each adapter it reaches, resident or not
        for a in adapters:
            named.add(a)
            if a < 0 or a in self.resident:
                continue
            cells = self.adapter_cells(a)
            if prefetch and cells > self.free:
                break
            self.resident[a] = cells
            self.adapters += cells
            loaded.append(a)
        if prefetch:
            self.prefetched = named
        return loaded

    def offload(self, keep: set[int]) -> None:
        """Drop every resident adapter outside `keep` and the latest prefetch's; with `keep` empty, all."""
        spare = self.prefetched if keep else set()
        for a in [a for a in self.resident if a not in keep and a not in spare]:
            self.adapters -= self.resident.pop(a)

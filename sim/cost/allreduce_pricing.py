"""What a tensor-parallel step's all-reduces cost, as vLLM runs them: the one pricing behind the engine's
roofline (`CostModel`) and the kernel model (`KernelCostModel`).

Each decoder layer reduces its activations twice (after attention and after the MLP): one all-reduce of
tokens x hidden x 2 bytes each. vLLM sends a message of at most 8 MiB on 2, 4, 6 or 8 fully NVLinked GPUs
(or 2 on PCIe) through its custom all-reduce, replayed in a CUDA graph, and larger ones through NCCL
(sim.cost.allreduce). Each is priced from the fit to its GPU's node at that degree (sim/catalog/
kernel_gpus.toml: aiconfigurator's measured tables; a GPU without its own, its NVLink generation's or, on
PCIe Gen4, the L40S's node). Where no table covers the node and degree (other PCIe parts, degree 6, AMD),
the stated prior: a latency (NVLink or PCIe) plus the ring bytes at a
share of the catalog's link bandwidth."""

from __future__ import annotations

from sim.catalog.gpus import Gpu
from sim.catalog.kernel_gpus import custom_allreduce_fit, nccl_fit
from sim.cost.allreduce import (
    CUSTOM_ALLREDUCE_DEGREES,
    CUSTOM_ALLREDUCE_MAX_BYTES,
    custom_seconds,
    nccl_seconds,
    ring_bytes,
)


class AllreducePricing:
    """All-reduce seconds over `tp` GPUs of `gpu`; `latency_s`, `latency_pcie_s` and `bandwidth_eff` are the
    prior where no measured fit covers the message."""

    def __init__(
        self, gpu: Gpu, tp: int, latency_s: float, latency_pcie_s: float, bandwidth_eff: float
    ) -> None:
        self.tp = tp
        self.pcie = "pcie" in gpu.interconnect.lower()
        self.nccl = nccl_fit(gpu, tp) if tp > 1 else None
        self.custom = custom_allreduce_fit(gpu, tp) if tp > 1 else None
        self.custom_ar = tp in CUSTOM_ALLREDUCE_DEGREES and (not self.pcie or tp == 2)  # as vLLM enables it
        self.prior_latency_s = latency_pcie_s if self.pcie else latency_s
        self.prior_bandwidth = gpu.interconnect_bandwidth * bandwidth_eff
        self._memo: dict[float, float] = {}

    def seconds(self, nbytes: float) -> float:
        """One all-reduce of `nbytes` (memoised by size: a step's messages take few distinct sizes)."""
        t = self._memo.get(nbytes)
        if t is None:
            t = self._memo[nbytes] = self._price(nbytes)
        return t

    def source(self, nbytes: float) -> str:
        """Which rule prices a message of `nbytes`: "custom", "nccl" or "prior"."""
        small = self.custom_ar and nbytes <= CUSTOM_ALLREDUCE_MAX_BYTES
        if small and self.custom is not None:
            return "custom"
        if self.nccl is not None and not small:
            return "nccl"
        return "prior"

    def _price(self, nbytes: float) -> float:
        rule = self.source(nbytes)
        if rule == "custom":
            assert self.custom is not None
            return float(custom_seconds(nbytes, self.tp, *self.custom, not self.pcie))
        if rule == "nccl":
            assert self.nccl is not None
            return float(nccl_seconds(nbytes, self.tp, *self.nccl))
        return self.prior_latency_s + float(ring_bytes(nbytes, self.tp)) / self.prior_bandwidth

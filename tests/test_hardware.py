"""GPU catalog: names, aliases, dense peaks and fallbacks."""

from __future__ import annotations

import pytest

from sim.catalog.gpus import get_gpu, gpu_names
from sim.io.errors import SimError

EXPECTED = [
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H800-SXM",
    "H200",
    "B200",
    "L4",
    "L40S",
    "A10G",
    "T4",
    "MI300X",
]


def test_catalog_has_all_gpus_with_sources() -> None:
    assert set(EXPECTED) <= set(gpu_names())
    for name in EXPECTED:
        g = get_gpu(name)
        assert g.source and g.flops_16bit > 0 and g.hbm_bandwidth > 0
        assert g.memory_bytes > 10e9 and g.interconnect_bandwidth > 0


def test_aliases_and_case() -> None:
    assert get_gpu("h100").name == "H100-SXM"
    assert get_gpu("a100-80gb").name == "A100-80GB"
    assert get_gpu(" mi300x ").name == "MI300X"


def test_dense_figures_not_sparse() -> None:
    h100 = get_gpu("H100")
    assert h100.flops_16bit == pytest.approx(989.5e12)
    assert h100.flops_fp8 == pytest.approx(2 * h100.flops_16bit)
    assert get_gpu("L40S").flops_fp8 == pytest.approx(733e12)


def test_memory_is_driver_reported_total() -> None:
    assert get_gpu("H100").memory_bytes == pytest.approx(79.19 * 2**30, rel=1e-3)


@pytest.mark.parametrize("name", ["A100-80GB", "A100-40GB", "T4", "A10G"])
def test_fp8_falls_back_to_16bit(name: str) -> None:
    g = get_gpu(name)
    peak, note = g.peak_flops("fp8")
    assert peak == g.flops_16bit and "no fp8" in note


def test_fp8_peak_used_where_supported() -> None:
    assert get_gpu("H100").peak_flops("fp8") == (1979e12, "")
    assert get_gpu("H100").peak_flops("bf16")[0] == 989.5e12


def test_unknown_gpu_lists_closest() -> None:
    with pytest.raises(SimError, match="did you mean H100"):
        get_gpu("H1000")


@pytest.mark.parametrize(
    ("typo", "meant"), [("A100-80G", "A100-80GB"), ("A100-40G", "A100-40GB"), ("H100-SXM5-80G", "H100-SXM")]
)
def test_near_miss_is_refused_with_did_you_mean(typo: str, meant: str) -> None:
    """A near miss of a catalog name is an error naming the GPU meant, never silently that GPU."""
    with pytest.raises(SimError, match=f"unknown GPU '{typo}'; did you mean {meant}"):
        get_gpu(typo)


def test_h800_is_an_h100_with_a_narrower_nvlink() -> None:
    """Same die, compute, HBM and memory as the H100 SXM; NVLink 400 GB/s bidirectional (200 per direction),
    under its own interconnect name, so the H100 board's NCCL all-reduce fit does not apply to it."""
    from sim.catalog.kernel_gpus import nccl_fit
    from sim.catalog.links import get_link

    h800, h100 = get_gpu("H800"), get_gpu("H100")
    same = ("flops_16bit", "flops_fp8", "flops_int8", "hbm_bandwidth", "memory_bytes", "compute_capability")
    for key in same:
        assert getattr(h800, key) == getattr(h100, key), key
    assert h800.interconnect_bandwidth == 200e9 and h100.interconnect_bandwidth == 450e9
    assert nccl_fit(h100, 8) is not None and nccl_fit(h800, 8) is None
    assert get_link("nvlink-4-h800").bandwidth == h800.interconnect_bandwidth
    assert "secondary" in h800.source

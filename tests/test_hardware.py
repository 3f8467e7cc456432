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

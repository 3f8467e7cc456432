"""`sim plan`'s comma-separated grid options and its placement options, checked before the search."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sim.catalog.quantisation import check_dtype
from sim.config.cluster import GroupSection
from sim.io.errors import SimError
from sim.studies.plan_placements import PlacementAxes
from sim.studies.plan_routers import ROUTER_KNOB, router_options


def whole_numbers(text: str, option: str) -> list[int]:
    """Whole numbers in [1, 1000000], comma-separated, as an option gives them."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SimError(f"{option}: expected whole numbers separated by commas (got {text!r})") from None
    if any(v < 1 or v > 1_000_000 for v in values):
        raise SimError(f"{option}: each value must be in [1, 1000000] (got {text!r})")
    return values


def placement_options(pp: str, ep_dp: str, nodes: int, gpus_per_node: int) -> PlacementAxes:
    """`--pp`, `--ep-dp`, `--nodes` and `--gpus-per-node`, checked against the group keys' ranges."""
    pps = sorted(set(whole_numbers(pp, "--pp")))
    if not pps:
        raise SimError(f"--pp: give one or more pipeline degrees, e.g. 1,2 (got {pp!r})")
    dps = sorted(set(whole_numbers(ep_dp, "--ep-dp")))
    given = [("--pp", "pp", v) for v in pps] + [("--ep-dp", "dp", v) for v in dps]
    given += [("--nodes", "nodes", nodes), ("--gpus-per-node", "gpus_per_node", gpus_per_node)]
    for option, key, value in given:
        try:  # the range of the group key the value becomes
            GroupSection.model_validate({key: value})
        except ValidationError as err:
            raise SimError(
                f"{option}: {err.errors()[0]['msg']}, as cluster.groups.{key} (got {value})"
            ) from None
    return PlacementAxes(tuple(pps), tuple(dps), nodes, gpus_per_node)


def _dtypes(text: str, key: str, option: str) -> list[str]:
    """Formats, comma-separated, each one the [model] key accepts."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    for v in values:
        try:
            check_dtype(key, v)
        except ValueError as err:
            raise SimError(f"{option}: {v!r}: {err}") from None
    return values


def _switch(text: str, option: str) -> list[bool]:
    """on/off values, comma-separated."""
    words = {"on": True, "off": False, "true": True, "false": False}
    values = [v.strip().lower() for v in text.split(",") if v.strip()]
    if any(v not in words for v in values):
        raise SimError(f"{option}: expected on, off or both, comma-separated (got {text!r})")
    return [words[v] for v in values]


def grid_options(
    gpus: str | None,
    tp: str,
    max_num_seqs: str,
    max_num_batched_tokens: str,
    modes: str,
    weight_dtypes: str = "",
    kv_dtypes: str = "",
    chunked_prefill: str = "",
    routers: str = "",
) -> tuple[list[str] | None, list[int], dict[str, list[Any]], list[str]]:
    """`sim plan`'s comma-separated grid options, checked: (GPU types, TP degrees, knob values, modes).
    The formats, chunked prefill and the router are searched only when given (opt-in axes)."""
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if not mode_list or set(mode_list) - {"colocated", "pd", "hetero"}:
        raise SimError(f"--modes: colocated, pd, hetero or several, comma-separated (got {modes!r})")
    tps = whole_numbers(tp, "--tp")
    if not tps or any(t > 64 for t in tps):
        raise SimError(f"--tp: TP degrees in [1, 64] (got {tp!r})")
    knobs = {
        "max_num_seqs": whole_numbers(max_num_seqs, "--max-num-seqs"),
        "max_num_batched_tokens": whole_numbers(max_num_batched_tokens, "--max-num-batched-tokens"),
        "weight_dtype": _dtypes(weight_dtypes, "weight_dtype", "--weight-dtypes"),
        "kv_dtype": _dtypes(kv_dtypes, "kv_dtype", "--kv-dtypes"),
        "enable_chunked_prefill": _switch(chunked_prefill, "--chunked-prefill"),
        ROUTER_KNOB: router_options(routers),
    }
    gpu_list = None if gpus is None else [g.strip() for g in gpus.split(",") if g.strip()]
    if gpu_list == []:
        raise SimError(
            f"--gpus: give one or more GPU types, comma-separated, e.g. A100-80GB,H100-SXM (got {gpus!r})"
        )
    return gpu_list, tps, knobs, mode_list

"""Engine profiles (sim/catalog/engines.toml): each engine's step-cost fits, one per model, GPU and tensor
parallel degree, with the published step times they were fitted to and where those come from."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sim.io.errors import SimError

FILE = "engines.toml"
DEFAULT_ENGINE = "vllm-0.15"  # today's vLLM: the calibrated roofline, no profile
SOURCE_KEYS = ("repo", "commit", "path", "form", "licence", "measured_on", "aligned")


@dataclass(frozen=True)
class EngineFit:
    """One fit of DistServe's estimator form, in milliseconds (the form: sim/catalog/engines.toml)."""

    model: str
    gpu: str
    tp: int
    prefill: tuple[float, float, float]  # fixed, per prompt token, per squared prompt token
    decode_small: tuple[float, float, float]  # fixed, per context token, per row: below `large_batch` rows
    decode_large: tuple[float, float, float]  # the same at `large_batch` rows or more
    large_batch: int
    step_ms: float = 0.0  # per step, beside the above (DistServe's simulator: its Ray overhead)
    step_ms_per_token: float = 0.0  # per context token of the step's rows
    decode_context: int = 0  # the cached tokens a row of every measured decode point had (0: not stated)
    prefill_points: tuple[tuple[int, float], ...] = ()  # (prompt tokens, ms) measured
    decode_points: tuple[tuple[int, float], ...] = ()  # (decode rows, ms) measured
    left_out: tuple[tuple[str, int, str], ...] = ()  # (kind, size, why) of measured points not fitted

    def key(self) -> str:
        return f"{self.model} on {self.gpu} with tp {self.tp}"


@dataclass(frozen=True)
class EngineProfile:
    """An engine: its fits and their source (repo, commit, path, form, licence, what it was measured on)."""

    name: str
    description: str
    fits: tuple[EngineFit, ...]
    source: dict[str, str]

    def fit_for(self, model: str, gpu: str, tp: int) -> EngineFit | None:
        """The fit for exactly this model, GPU and tp, or None."""
        return next((f for f in self.fits if (f.model, f.gpu, f.tp) == (model, gpu, tp)), None)

    def reference_for(self, model: str, tp: int) -> EngineFit:
        """The fit the transfer rule reads for a setup without its own: the same model and tp, else the same
        model at the nearest tp, else the profile's first fit."""
        same = [f for f in self.fits if f.model == model]
        if same:
            return min(same, key=lambda f: (abs(f.tp - tp), f.tp))
        return self.fits[0]


def _triple(value: object, where: str) -> tuple[float, float, float]:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) for v in value)):
        raise SimError(f"{FILE}: {where}: expected three numbers (got {value!r})")
    return (float(value[0]), float(value[1]), float(value[2]))


def _points(value: object, where: str) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise SimError(f"{FILE}: {where}: expected a list of [size, ms] pairs")
    return tuple((int(p[0]), float(p[1])) for p in value)


def _left_out(value: object, where: str) -> list[tuple[str, int, str]]:
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise SimError(f"{FILE}: {where}: expected a list of {{kind, size, why}} tables")
    try:
        return [(str(p["kind"]), int(p["size"]), str(p["why"])) for p in value]
    except KeyError as err:
        raise SimError(f"{FILE}: {where}: missing {err.args[0]}") from None


def _fit(table: dict[str, object], where: str) -> EngineFit:
    try:
        return EngineFit(
            model=str(table["model"]),
            gpu=str(table["gpu"]),
            tp=int(table["tp"]),  # type: ignore[call-overload]
            prefill=_triple(table["prefill"], f"{where}.prefill"),
            decode_small=_triple(table["decode_small"], f"{where}.decode_small"),
            decode_large=_triple(table["decode_large"], f"{where}.decode_large"),
            large_batch=int(table["large_batch"]),  # type: ignore[call-overload]
            step_ms=float(table.get("step_ms", 0.0)),  # type: ignore[arg-type]
            step_ms_per_token=float(table.get("step_ms_per_token", 0.0)),  # type: ignore[arg-type]
            decode_context=int(table.get("decode_context", 0)),  # type: ignore[call-overload]
            prefill_points=_points(table.get("prefill_points", []), f"{where}.prefill_points"),
            decode_points=_points(table.get("decode_points", []), f"{where}.decode_points"),
            left_out=tuple(_left_out(table.get("left_out", []), f"{where}.left_out")),
        )
    except KeyError as err:
        raise SimError(f"{FILE}: {where}: missing {err.args[0]}") from None


@cache
def engines() -> dict[str, EngineProfile]:
    """Every engine of the catalog by name, today's (no fits) included."""
    raw = tomllib.loads((resources.files("sim") / "catalog" / FILE).read_text())["engines"]
    out: dict[str, EngineProfile] = {}
    for name, table in raw.items():
        fits = tuple(_fit(f, f"engines.{name}.fits[{i}]") for i, f in enumerate(table.get("fits", [])))
        if name != DEFAULT_ENGINE and not fits:
            raise SimError(f"{FILE}: engines.{name}: no fits")
        source = {k: str(table[k]) for k in SOURCE_KEYS if k in table}
        out[name] = EngineProfile(name, str(table["description"]), fits, source)
    return out


def engine_names() -> list[str]:
    """The engines a policy may name, sorted."""
    return sorted(engines())


def get_engine(name: str) -> EngineProfile:
    """The engine called `name`; an unknown name is an error listing the known ones."""
    found = engines().get(name)
    if found is None:
        raise SimError(f"unknown engine {name!r}; known: {', '.join(engine_names())}")
    return found

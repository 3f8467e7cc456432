"""Scenario files: TOML validated by pydantic, with errors that name the file and the dotted key."""

from __future__ import annotations

import copy
import math
import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import Calibration, calibration_problem
from sim.config.cluster import ClusterSection, check_cluster
from sim.config.lora import check_lora
from sim.config.policies import POLICIES
from sim.config.sections import HorizonSection, ModelSection, SloSection, StrictTable
from sim.config.speculative import check_draft
from sim.config.validation import format_validation_error
from sim.config.workload import WorkloadConfig
from sim.io.errors import SimError

MAX_SCENARIO_BYTES = 16 * 2**20
POLICY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class Scenario(StrictTable):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    seed: int = Field(0, ge=0, le=2**63 - 1)
    model: ModelSection
    workload: WorkloadConfig
    policies: dict[str, dict[str, Any]] = Field(min_length=1)
    horizon: HorizonSection
    slo: SloSection = SloSection()
    calibration: dict[str, float] = Field(
        default_factory=dict,
        description="Cost-model calibration overrides: efficiencies (*_eff*, fractions of a peak) in "
        "[0.001, 1], overheads (*_s) in [0, 1] seconds.",
    )
    sweep: dict[str, Any] | None = Field(None, description="Grid for `sim sweep` (see sim/config/sweep.py).")
    cluster: ClusterSection | None = Field(None, description="Replicas behind a router (see sim/fleet).")
    prices: dict[str, float] = Field(
        default_factory=dict,
        description="$/GPU-hour by GPU name, over the catalogue's (sim/catalog/prices.toml).",
    )

    @model_validator(mode="after")
    def _calibration_in_range(self) -> Scenario:

        known = {f.name for f in fields(Calibration)}
        for key, value in self.calibration.items():
            if key not in known:
                raise ValueError(f"calibration.{key}: unknown parameter (one of {', '.join(sorted(known))})")
            why = calibration_problem(key, value)
            if why is not None:
                raise ValueError(f"calibration.{key}: {why}")
        for key, value in self.prices.items():
            if not 0.0 < value <= 1000.0:
                raise ValueError(f"prices.{key}: $/GPU-hour must be in (0, 1000] (got {value:g})")
            try:
                get_gpu(key)
            except SimError as err:  # a misspelt name would leave the catalogue's price in use
                raise ValueError(f"prices.{key}: {err}") from None
        return self

    # Resolved policy configs (pydantic models of each scheduler), filled by `validate_scenario`,
    # and the validated TOML mapping itself (overrides applied), for records of what ran.
    _policy_configs: dict[str, BaseModel] = {}
    _raw: dict[str, Any] = {}
    _router_config: BaseModel | None = None

    @property
    def raw(self) -> dict[str, Any]:
        """The scenario as read from TOML, with `--set` overrides applied."""
        return copy.deepcopy(self._raw)

    def policy(self, name: str) -> tuple[str, BaseModel]:
        """The scheduler name and validated config of a policy table."""
        table = self.policies[name]
        return table["scheduler"], self._policy_configs[name]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    node = data
    keys = dotted.split(".")
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise SimError(f"{source}: --set {dotted}: {key} is not a table")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`key.path=value`; the value is read as TOML (numbers, booleans, arrays, tables), else as a string."""
    if "=" not in text:
        raise SimError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for key, value in overrides.items():
        _set_dotted(data, key, value, source)
    return data


def _non_finite(node: Any, where: str) -> str | None:
    """The dotted key of the first inf or nan anywhere in a TOML mapping, else None."""
    if isinstance(node, float) and not math.isfinite(node):
        return where
    items: Any = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        sub = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else str(key))
        found = _non_finite(child, sub)
        if found is not None:
            return found
    return None


def validate_scenario(data: dict[str, Any], source: str) -> Scenario:
    """Validate a scenario mapping (from TOML after overrides), including each policy's own knobs."""
    bad = _non_finite(data, "")
    if bad is not None:
        raise SimError(f"{source}: {bad}: must be a finite number")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise SimError(format_validation_error(err, data, source, root="")) from None
    configs: dict[str, BaseModel] = {}
    for name, table in scenario.policies.items():
        if not POLICY_NAME.match(name):
            raise SimError(
                f"{source}: policies.{name}: a policy name is letters, digits, '_', '-' and '.' "
                "(it names the policy's output folder)"
            )
        if not isinstance(table, dict) or "scheduler" not in table:
            raise SimError(
                f"{source}: policies.{name}.scheduler: missing (one of {', '.join(sorted(POLICIES))})"
            )
        kind = table["scheduler"]
        if not isinstance(kind, str) or kind not in POLICIES:
            raise SimError(
                f"{source}: policies.{name}.scheduler: unknown scheduler {str(kind)[:40]!r} "
                f"(one of {', '.join(sorted(POLICIES))})"
            )
        knobs = {k: v for k, v in table.items() if k != "scheduler"}
        try:
            configs[name] = POLICIES[kind].model_validate(knobs)
        except ValidationError as err:
            raise SimError(format_validation_error(err, knobs, source, root=f"policies.{name}")) from None
        if getattr(configs[name], "enable_chunked_prefill", True) is False:
            budget = configs[name].max_num_batched_tokens  # type: ignore[attr-defined]
            if budget < scenario.model.max_model_len:  # a whole prompt must fit one step
                raise SimError(
                    f"{source}: policies.{name}.max_num_batched_tokens: must be at least model.max_model_len "
                    f"({scenario.model.max_model_len}) when enable_chunked_prefill = false (got {budget})"
                )
    if scenario.cluster is not None:
        scenario._router_config = check_cluster(scenario.cluster, scenario.policies, source)
        for name, config in configs.items():  # speculative decoding is modelled on one replica only
            if getattr(config, "speculative", None) is not None:
                raise SimError(f"{source}: policies.{name}.speculative: not modelled with [cluster]")
    check_lora(scenario, configs, source)
    _check_drafts(scenario, configs, source)
    if scenario.workload.sampling is not None:
        for name in configs:
            kind = scenario.policies[name]["scheduler"]
            if kind not in ("vllm", "sarathi"):
                raise SimError(
                    f"{source}: policies.{name}.scheduler: workload.sampling is costed for the vllm and "
                    f"sarathi schedulers (vLLM's sampler), not {kind}"
                )
    for name, config in configs.items():
        if getattr(config, "speculative", None) is not None and getattr(config, "lora", None) is not None:
            raise SimError(f"{source}: policies.{name}: speculative decoding with LoRA is not modelled")
    scenario._policy_configs = configs
    scenario._raw = copy.deepcopy(data)
    return scenario


def _check_drafts(scenario: Scenario, configs: dict[str, BaseModel], source: str) -> None:
    """Each draft model against the target, as vLLM checks them (an unknown target is reported, with its
    key, where the replica is built)."""
    drafting = {n: c.speculative for n, c in configs.items() if getattr(c, "speculative", None) is not None}
    if not any(spec.method == "draft" for spec in drafting.values()):
        return
    try:
        target = load_model(scenario.model.name)
    except SimError:
        return
    for name, spec in drafting.items():
        try:
            check_draft(spec, target, scenario.model.tp)
        except ValueError as err:
            raise SimError(f"{source}: policies.{name}.speculative.{err}") from None


def read_toml(path: Path) -> dict[str, Any]:
    """A scenario file's TOML mapping; SimError for a missing, unreadable, binary or malformed file."""
    if not path.exists():
        raise SimError(f"{path}: no such scenario file")
    if path.is_dir():
        raise SimError(f"{path}: is a folder, not a scenario file")
    if not path.is_file():
        raise SimError(f"{path}: not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_SCENARIO_BYTES + 1)
    except OSError as err:
        raise SimError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > MAX_SCENARIO_BYTES:
        raise SimError(f"{path}: larger than {MAX_SCENARIO_BYTES // 2**20} MiB; not a scenario file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SimError(f"{path}: not a UTF-8 text file (bad byte at offset {err.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SimError(f"{path}: not valid TOML: {err}") from None


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override (`--set key.path=value`) and validate a scenario file."""
    path = Path(path)
    data = read_toml(path)
    parsed = dict(parse_override(o) for o in overrides or [])
    return validate_scenario(apply_overrides(data, parsed, str(path)), str(path))


def schema() -> dict[str, Any]:
    """The JSON schema of a scenario file, with each registered policy's knobs."""
    out = Scenario.model_json_schema()
    out["x-policies"] = {name: config.model_json_schema() for name, config in sorted(POLICIES.items())}
    return out

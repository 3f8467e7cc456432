"""`sim capacity`, `sim step`, `sim kernels`, `sim schema`: a model on a GPU, and the scenario schema."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sim.cli.app import app
from sim.io.errors import SimError
from sim.io.limits import MAX_TOKENS
from sim.io.paths import out_file_problem
from sim.report.options import out_option


def refuse_with_placement(options: list[str]) -> None:
    """Options given with --pp/--ep/--dp that the placement's costs leave out are refused, not ignored."""
    if options:
        raise SimError(f"{', '.join(options)}: costed with tensor parallelism only, not with --pp/--ep/--dp")


@app.command("capacity")
def capacity(
    models: list[str] = typer.Argument(..., help="Model: catalog name, HF id or config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. A100-80GB, H100."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, max=64, help="Pipeline-parallel stages."),
    ep: int = typer.Option(1, "--ep", min=1, max=1024, help="Expert-parallel ranks (1 or tp x dp)."),
    dp: int = typer.Option(1, "--dp", min=1, max=1024, help="Data-parallel attention ranks."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=72, help="GPUs per node."),
    expert_skew: float = typer.Option(
        0.0, "--expert-skew", min=0.0, max=4.0, help="Zipf exponent of the gate."
    ),
    redundant_experts: int = typer.Option(
        0, "--redundant-experts", min=0, max=4096, help="EPLB's redundant experts (EP)."
    ),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", min=0.0, max=1.0),
    weight_dtype: str | None = typer.Option(None, "--weight-dtype", help="fp32 bf16 fp16 fp8 int8 int4"),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="KV-cache dtype (default: model dtype)."),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", min=1, max=MAX_TOKENS, help="Default: the model's."
    ),
    typical_len: int = typer.Option(
        1024, "--typical-len", min=1, max=MAX_TOKENS, help="Typical prompt + output tokens."
    ),
    compare: bool = typer.Option(False, "--compare", help="Several models side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    draft_model: str | None = typer.Option(None, "--draft-model", help="Speculative draft model beside it."),
    draft_tp: int | None = typer.Option(None, "--draft-tp", min=1, max=64, help="Draft's TP (default --tp)."),
    max_loras: int = typer.Option(0, "--max-loras", min=0, max=4096, help="LoRA GPU slots taken from KV."),
    max_lora_rank: int = typer.Option(16, "--max-lora-rank", min=1, max=512, help="Rank of the LoRA slots."),
    weight_group_size: int | None = typer.Option(
        None,
        "--weight-group-size",
        min=0,
        max=1024,
        help="int4/int8 weights per 16-bit scale (0: per channel).",
    ),
    quantisation: bool = typer.Option(
        False, "--quantisation", help="One model under each weight and KV-cache format, side by side."
    ),
) -> None:
    """KV-cache capacity: weights, reserve, KV blocks and the sequences that fit, with the arithmetic."""
    from sim.cost.placement import Placement
    from sim.report.capacity import print_capacity

    placement = Placement(tp, pp, ep, dp, None, gpus_per_node, expert_skew,
                          ep_redundant_experts=redundant_experts)  # fmt: skip
    if placement.beyond_tp:  # memory per GPU of the placement (sim/report/parallel.py)
        from sim.report.parallel import parallel_capacity

        if len(models) > 1:
            raise SimError("--pp, --ep and --dp take one model")
        unused = [name for name, given in (
            ("--max-model-len", max_model_len is not None), ("--compare", compare),
            ("--draft-model", draft_model is not None), ("--draft-tp", draft_tp is not None),
            ("--max-loras", max_loras > 0), ("--weight-group-size", weight_group_size is not None),
            ("--quantisation", quantisation),
        ) if given]  # fmt: skip
        refuse_with_placement(unused)
        parallel_capacity(models[0], gpu, placement, gpu_memory_utilization, weight_dtype, kv_dtype, as_json)
        return

    print_capacity(
        models, gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_model_len, typical_len, compare,
        as_json, draft_model, draft_tp, max_loras, max_lora_rank, weight_group_size, quantisation,
    )  # fmt: skip


@app.command("step")
def step(
    model: str = typer.Argument(..., help="Model: catalog name, HF id or config.json path."),
    gpu: str = typer.Option(..., "--gpu", help="GPU name, e.g. H100, H200, A100-80GB."),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, max=64, help="Pipeline-parallel stages."),
    ep: int = typer.Option(1, "--ep", min=1, max=1024, help="Expert-parallel ranks (1 or tp x dp)."),
    dp: int = typer.Option(1, "--dp", min=1, max=1024, help="Data-parallel attention ranks."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=72, help="GPUs per node."),
    expert_skew: float = typer.Option(
        0.0, "--expert-skew", min=0.0, max=4.0, help="Zipf exponent of the gate."
    ),
    two_batch_overlap: bool = typer.Option(
        False, "--two-batch-overlap", help="Two micro-batches, the all-to-all behind compute (EP)."
    ),
    ep_all_to_all: str = typer.Option(
        "per_expert", "--ep-all-to-all", help="per_expert, deepep_normal, deepep_low_latency, deepep_auto."
    ),
    ep_dispatch_dtype: str = typer.Option("bf16", "--ep-dispatch-dtype", help="bf16 or fp8 (combine bf16)."),
    redundant_experts: int = typer.Option(
        0, "--redundant-experts", min=0, max=4096, help="EPLB's redundant experts (EP)."
    ),
    weight_dtype: str | None = typer.Option(None, "--weight-dtype", help="bf16 fp16 fp8 int8 int4."),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="KV-cache dtype (default: model dtype)."),
    batch: int | None = typer.Option(None, "--batch", help="Decode: sequences, a token each."),
    context: int | None = typer.Option(None, "--context", help="Decode step: cached tokens per sequence."),
    prefill: int | None = typer.Option(None, "--prefill", help="Prefill: one prompt of L tokens."),
    calibration: Path | None = typer.Option(None, "--calibration", help="A \\[calibration] TOML file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    weight_group_size: int | None = typer.Option(
        None, "--weight-group-size", min=0, max=1024, help="int4/int8 weights per 16-bit scale (0: per row)."
    ),
) -> None:
    """One step's time as the engine charges it, and its kernel-by-kernel breakdown (kernel profiles)."""
    from sim.catalog.quantisation import check_format_options
    from sim.cost.placement import Placement
    from sim.report.step import print_step

    check_format_options(weight_dtype, kv_dtype, weight_group_size)
    from sim.cost.expert_parallel import ALL_TO_ALL, DISPATCH_DTYPES

    for option, value, allowed in (("--ep-all-to-all", ep_all_to_all, ALL_TO_ALL),
                                   ("--ep-dispatch-dtype", ep_dispatch_dtype, DISPATCH_DTYPES)):  # fmt: skip
        if value not in allowed:
            raise SimError(f"{option}: {value[:40]!r} is not one of {', '.join(allowed)}")
    placement = Placement(tp, pp, ep, dp, None, gpus_per_node, expert_skew,
                          two_batch_overlap=two_batch_overlap, ep_dispatch_dtype=ep_dispatch_dtype,
                          ep_all_to_all=ep_all_to_all, ep_redundant_experts=redundant_experts)  # fmt: skip
    if placement.beyond_tp:  # per stage and rank, with the communication kernels (sim/report/parallel.py)
        from sim.catalog.models import load_model
        from sim.report.parallel import parallel_step
        from sim.report.step import check_step_length, step_rows

        unused = [name for name, given in (
            ("--calibration", calibration is not None),
            ("--weight-group-size", weight_group_size is not None),
        ) if given]  # fmt: skip
        refuse_with_placement(unused)
        c, q = step_rows(batch, context, prefill)
        check_step_length(load_model(model), context, prefill)
        parallel_step(model, gpu, placement, weight_dtype, kv_dtype, c, q, as_json)
        return
    print_step(model, gpu, tp, weight_dtype, kv_dtype, batch, context, prefill, calibration, as_json,
               weight_group_size)  # fmt: skip


@app.command("kernels")
def kernels(
    write: Path | None = out_option(
        "Write the per-GPU parameter file here (sim/catalog/kernel_gpus.toml).",
        out_file_problem,
        name="--write",
    ),
    import_vidur: Path | None = typer.Option(
        None, "--import-vidur", help="First convert Vidur's data/profiling folder into the catalog's tables."
    ),
    import_aiconfigurator: Path | None = typer.Option(
        None,
        "--import-aiconfigurator",
        help="First convert the aiconfigurator_core package folder's tables into the catalog's tables.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fit per-GPU kernel parameters to the kernel profiles; test the transfer rule by leaving a GPU out."""

    from sim.report.kernels import print_kernels

    command = "sim kernels " + " ".join(sys.argv[2:])
    print_kernels(write, import_vidur, as_json, command, import_aiconfigurator)


@app.command("schema")
def schema() -> None:
    """Print the JSON schema of scenario files (with each policy's knobs)."""
    import json

    from sim.config.scenario import schema as scenario_schema

    typer.echo(json.dumps(scenario_schema(), indent=2))

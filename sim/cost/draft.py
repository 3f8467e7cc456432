"""What a speculative proposer costs: the draft model's or head's steps and its share of the KV memory."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.config.speculative import SpeculativeConfig
from sim.cost.memory import kv_bytes_per_token_per_gpu
from sim.cost.roofline import CostModel
from sim.io.errors import SimError


def head_spec(target: ModelSpec, layers: int, draft_vocab: int | None = None) -> ModelSpec:
    """A drafting head: `layers` decoder layers of the target's shape, its LM head (shared weights), no
    embedding of its own. With `draft_vocab` (EAGLE-3's `draft_vocab_size`) the head's own LM head covers
    only that many tokens (mapped to the target's ids), so each pass reads and multiplies draft_vocab x
    hidden weights rather than the whole vocabulary's."""
    f = layers / target.num_layers
    moe = round(target.num_moe_layers * f)
    vocab = (
        {}
        if draft_vocab is None
        else {"vocab_size": draft_vocab, "lm_head_params": draft_vocab * target.hidden_size}
    )
    return replace(
        target,
        **vocab,
        name=f"{target.name} head ({layers} layers)",
        num_layers=layers,
        num_sliding_layers=min(layers, round(target.num_sliding_layers * f)),
        num_moe_layers=moe,
        attention_params=round(target.attention_params * f),
        dense_params=round(target.dense_params * f),
        routed_expert_params=moe * target.num_experts * target.expert_params,
        norm_params=round(target.norm_params * f),
    )


@dataclass(slots=True)
class Drafter:
    """The proposer's cost model (None for n-gram) and the memory it takes on the GPU holding most of it (a
    draft sharded over fewer GPUs than the target sits whole on the first ones, which then bind the KV
    blocks every GPU gets)."""

    method: str
    k: int
    cost: CostModel | None
    weight_bytes: int  # per GPU, beside the target's
    kv_bytes_per_token: int  # per GPU, beside the target's
    host_s_per_row: float
    name: str


def build_drafter(config: SpeculativeConfig, target: CostModel) -> Drafter:
    """The proposer of a `speculative` table, on the target's GPU type and tensor parallelism."""
    k, tp = config.num_speculative_tokens, target.tp
    # Proposers draft greedily (argmax): no sort over the vocabulary, so no sampler term.
    greedy = replace(target.calibration, sampler_s_per_entry=0.0)
    if config.method == "ngram":
        return Drafter("ngram", k, None, 0, 0, config.ngram_s_per_row, "n-gram")
    kv_dtype = target.kv_dtype
    if config.method == "draft":
        assert config.draft_model is not None
        spec = load_model(config.draft_model)
        tp = config.draft_tensor_parallel_size or tp
        if spec.num_heads % tp:
            raise SimError(
                f"speculative.draft_tensor_parallel_size: {spec.name} has {spec.num_heads} attention heads, "
                f"not divisible by {tp}; set draft_tensor_parallel_size (sim capacity: --draft-tp; 1 runs "
                "the draft on one GPU)"
            )
        cost = CostModel(spec, target.gpu, tp, None, kv_dtype, greedy)
        weights = int(spec.weight_bytes() / tp)
        name = spec.name
    else:
        assert config.head_layers is not None
        spec = head_spec(target.model, config.head_layers, config.draft_vocab_size)
        cost = CostModel(spec, target.gpu, tp, target.weight_dtype, kv_dtype, greedy)
        # An EAGLE-3 head with a reduced vocabulary has its own LM head; otherwise it shares the target's.
        groups = ("attention", "dense", "experts", "norm") + (("lm_head",) if config.draft_vocab_size else ())
        wd = target.weight_dtype
        weights = int(sum(spec.group_params(g) * spec.param_bytes(g, wd) for g in groups) / tp)
        name = f"{config.method} head, {config.head_layers} layers"
    kv = kv_bytes_per_token_per_gpu(spec, tp, kv_dtype)
    return Drafter(config.method, k, cost, weights, kv, 0.0, name)


def kv_blocks_with_draft(available: int, target_per_token: int, drafter: Drafter, block_size: int) -> int:
    """KV blocks when the draft's weights come out of the KV memory and every block also holds the draft's
    KV for its tokens (one block table for both, as vLLM allocates them)."""
    per_block = (target_per_token + drafter.kv_bytes_per_token) * block_size
    return max(0, (available - drafter.weight_bytes) // per_block)

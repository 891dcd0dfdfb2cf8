#!/usr/bin/env bash
# Issue 61's full 48-layer Qwen3-30B-A3B shape (random bf16, 57 GiB) on one GPU: the
# checkpoint drawn on the GPU into a tmpfs (44 s on an H200, 5 minutes drawn on the CPU to
# disk: docs/log/2026-11-30-moe-experts-a-pair-at-a-time.md), then each engine's decode steps
# beside the bound (fitness bench --step-time --roofline, 3 runs), the engines in the order
# given (name one twice to interleave: A B A B).
#   bash tools/gpu/moe_full48.sh OUT ENGINE [ENGINE ...]
# CASES: the cases benched (default decode_1x128x64; add decode_64x256x64 for the 64-row step).
# An engine takes ~2 minutes on the batch-1 case and ~6 with both (a fresh engine a run, 57 GiB
# read each time): within one 10-minute call, four engines at batch 1 or one with both
# (docs/log/2026-11-30-moe-committed-recipe-through-the-gate.md).
set -uo pipefail
out=$1; shift
mkdir -p "$out"
source tools/gpu/env.sh
ram_folder 64 || exit 1
started=$(date +%s)
python3 -m target.hf_checkpoints /mnt/ram --device cuda --only qwen3_30b_a3b > /dev/null 2> "$out/checkpoint.err" \
    || { tail -5 "$out/checkpoint.err"; exit 1; }
echo "checkpoint written in $(( $(date +%s) - started )) s"
dir=/mnt/ram/qwen3_30b_a3b
cases=(); for c in ${CASES:-decode_1x128x64}; do cases+=(--case "$c"); done
i=0
for engine in "$@"; do
  i=$((i + 1))
  decode_steps "$i $(basename "$engine" .py)" "$engine" "$dir" "$out/$i.$(basename "$engine" .py).json" \
      "${cases[@]}" --warmup 1 --repeat 3
done

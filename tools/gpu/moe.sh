#!/usr/bin/env bash
# Issue 61 on a 2-GPU host (128 GiB of disk: the 57 GiB checkpoint fits), in one call:
# Qwen3-30B-A3B's shape, random bf16 (target/hf_checkpoints.py), the hand-composed MoE
# program (mutations/recipes/qwen3_moe_by_hand.txt) beside transformers eager, GPU 0 ours,
# GPU 1 transformers, at once.
#   bash tools/gpu/moe.sh OUT
# 1. the MoE kernels compiled, bf16, inside a captured graph (tests/test_gpu.py -k moe);
# 2. 4 layers of the real width (5.8 GiB): logits against transformers fp32 on the GPU, with
#    transformers' own bf16 as the yardstick; fitness bench's batch-1 and 64-row steps of the
#    program and of the seed; transformers eager's;
# 3. all 48 layers (written meanwhile): the program's steps against the bound (--roofline),
#    transformers eager's batch-1 step ($HF_STEPS steps, default 8), then the server at 64
#    requests at once (1,024 tokens in, 323 out) and a burst of 300 (a toy tokenizer of its vocab).
# Each stage appends to OUT; a stage that fails is noted and the next one runs.
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
engine=/tmp/by_hand.py
python3 -m mutations recipe mutations/recipes/qwen3_moe_by_hand.txt -o "$engine" > /dev/null || exit 1
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }

stage kernels
CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k moe 2>&1 | tail -15 > "$out/gpu_tests.txt"
tail -1 "$out/gpu_tests.txt"

stage checkpoints
python3 -m target.hf_checkpoints /tmp/hf --only qwen3_30b_a3b_4_layers > /dev/null || exit 1
(python3 -m target.hf_checkpoints /tmp/hf --only qwen3_30b_a3b > /dev/null 2> "$out/full_write.err"; \
 echo "full checkpoint written $(date +%T), rc $?" >> "$out/stages.txt"; \
 python3 -m target.toy_tokenizer --config /tmp/hf/qwen3_30b_a3b/config.json --output /tmp/hf/qwen3_30b_a3b \
   > /dev/null 2>> "$out/full_write.err") &
writer=$!

four=/tmp/hf/qwen3_30b_a3b_4_layers full=/tmp/hf/qwen3_30b_a3b
stage four layers
(CUDA_VISIBLE_DEVICES=1 python3 -m tools.transformers_bench "$four" --mode eager --repeat 3 \
    --case decode_1x128x64 --case decode_64x256x64 > "$out/transformers_4_layers.txt" 2> "$out/transformers_4_layers.err") &
hf4=$!
CUDA_VISIBLE_DEVICES=0 python3 -m tools.matches_transformers "$engine" "$four" --device cuda 2> "$out/matches.err" \
    | tee "$out/matches_4_layers.json"
for program in "$engine" seed_engine/engine.py; do
  CUDA_VISIBLE_DEVICES=0 decode_steps "4 layers $program" "$program" "$four" \
      "$out/bench_4_layers_$(basename "$program" .py).json"
done
wait $hf4; cat "$out/transformers_4_layers.txt"
wait $writer

stage all 48 layers
(CUDA_VISIBLE_DEVICES=1 python3 -m tools.transformers_bench "$full" --mode eager --repeat 1 --case decode_1x128x64 \
    --steps "${HF_STEPS:-8}" > "$out/transformers_48_layers.txt" 2> "$out/transformers_48_layers.err") &
hf48=$!
CUDA_VISIBLE_DEVICES=0 decode_steps "48 layers by hand" "$engine" "$full" "$out/bench_48_layers.json" --warmup 1 --repeat 1

stage served
if CUDA_VISIBLE_DEVICES=0 start_server "$out" --engine "$engine" --model-config "$full/config.json" --weight-dir "$full"; then
  python3 -m serve.bench --base-url "$url" --tokenizer "$full" --out "$out" --concurrency 64 \
      --num-requests 64 --input-len 1024 --output-len 323 --burst 300 | tee "$out/served.txt"
  beside_bound "$out" "$full" | tee -a "$out/served.txt"
fi
kill $server 2>/dev/null
wait $hf48; cat "$out/transformers_48_layers.txt"
stage done

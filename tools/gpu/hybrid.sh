#!/usr/bin/env bash
# Issue 62 on a 2-GPU host (128 GiB of disk: the 64.6 GiB checkpoint fits): Qwen3.5-35B-A3B's
# text model, random bf16 (target/hf_checkpoints.py), the seed engine beside transformers
# eager (GPU 0 ours, GPU 1 transformers, at once).
#   bash tools/gpu/hybrid.sh OUT
# 1. the gate on the GPU: the seed judged on the tiny hybrid in bf16, every derived config;
# 2. 4 layers of the real width (3 Gated DeltaNet, 1 attending; 8.2 GiB): the seed's logits
#    against transformers fp32 on the GPU, transformers' own bf16 as the yardstick; the seed's
#    batch-1 and 64-row decode steps beside the bound; transformers eager's;
# 3. all 40 layers (written meanwhile): the seed's batch-1 step beside the bound, and
#    transformers eager's ($HF_STEPS steps, default 8).
# Each stage appends to OUT; a stage that fails is noted and the next one runs. Longer than
# one device call: start it under setsid and follow OUT/stages.txt.
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
seed=seed_engine/engine.py
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }

stage checkpoints
python3 -m target.hf_checkpoints /tmp/hf --only tiny_qwen3_5_moe --only qwen3_5_35b_a3b_4_layers > /dev/null || exit 1
(python3 -m target.hf_checkpoints /tmp/hf --only qwen3_5_35b_a3b > /dev/null 2> "$out/full_write.err"; \
 echo "full checkpoint written $(date +%T), rc $?" >> "$out/stages.txt") &
writer=$!
tiny=/tmp/hf/tiny_qwen3_5_moe four=/tmp/hf/qwen3_5_35b_a3b_4_layers full=/tmp/hf/qwen3_5_35b_a3b

stage gate on the tiny hybrid
CUDA_VISIBLE_DEVICES=0 python3 -m fitness judge "$seed" --model-config "$tiny" --weight-dir "$tiny" --device cuda \
    --bench none --vouch > "$out/gate_tiny.json" 2> "$out/gate_tiny.err"
python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(v['status'], v['stage'], v['worst_ratio'], v['worst_case'], v['error'][:300])" "$out/gate_tiny.json"

stage four layers
(CUDA_VISIBLE_DEVICES=1 python3 -m tools.transformers_bench "$four" --mode eager --repeat 2 \
    --case decode_1x128x64 --case decode_64x256x64 > "$out/transformers_4_layers.txt" 2> "$out/transformers_4_layers.err") &
hf4=$!
CUDA_VISIBLE_DEVICES=0 python3 -m tools.matches_transformers "$seed" "$four" --device cuda 2> "$out/matches.err" \
    | tee "$out/matches_4_layers.json"
CUDA_VISIBLE_DEVICES=0 decode_steps "4 layers seed" "$seed" "$four" "$out/bench_4_layers_seed.json" --warmup 1 --repeat 2
wait $hf4; cat "$out/transformers_4_layers.txt"
wait $writer

stage all 40 layers
(CUDA_VISIBLE_DEVICES=1 python3 -m tools.transformers_bench "$full" --mode eager --repeat 1 --case decode_1x128x64 \
    --steps "${HF_STEPS:-8}" > "$out/transformers_40_layers.txt" 2> "$out/transformers_40_layers.err") &
hf40=$!
CUDA_VISIBLE_DEVICES=0 decode_steps "40 layers seed" "$seed" "$full" "$out/bench_40_layers_seed.json" \
    --case decode_1x128x64 --warmup 1 --repeat 1
wait $hf40; cat "$out/transformers_40_layers.txt"
stage done

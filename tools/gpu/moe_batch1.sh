#!/usr/bin/env bash
# Issue 61's batch-1 decode step on one GPU, engine against engine, on 4 layers of
# Qwen3-30B-A3B's width (random bf16, target/hf_checkpoints.py):
#   bash tools/gpu/moe_batch1.sh OUT ENGINE_A ENGINE_B [ENGINE ...]
# 1. the MoE kernels and recipes on the GPU (tests/test_gpu.py -k moe), the
#    MoE part alone at the allele's defaults (tools.probes.moe_layer_bench --quick), and
#    ENGINE_A's logits against transformers fp32 (tools.matches_transformers);
# 2. each engine's batch-1 step kernel by kernel (tools.probes.step_timeline);
# 3. A and B benched in turn on decode_1x128x64, fresh processes, the order swapped each round
#    (ROUNDS, default 3), step times (--step-time) and the ratio (tools.versus_recipe).
set -uo pipefail
out=$1; shift
mkdir -p "$out"
source tools/gpu/env.sh
source tools/gpu/bench_rounds.sh
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }
dir=/tmp/hf/qwen3_30b_a3b_4_layers

stage kernels
python3 -m target.hf_checkpoints /tmp/hf --only qwen3_30b_a3b_4_layers > /dev/null &
writer=$!
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k moe 2>&1 | tail -15 > "$out/gpu_tests.txt"
tail -1 "$out/gpu_tests.txt"
python3 -m tools.probes.moe_layer_bench --rows 1 8 64 --quick 2>&1 | tee "$out/moe_layer_bench.txt"
wait $writer || exit 1
python3 -m tools.matches_transformers "$1" "$dir" --device cuda 2> "$out/matches.err" | tee "$out/matches.json"

for engine in "$@"; do
  stage timeline "$engine"
  timeline=$out/timeline_$(basename "$engine" .py).json
  python3 -m tools.probes.step_timeline --engine "$engine" --model-config "$dir/config.json" --weight-dir "$dir" \
      > "$timeline" 2>> "$out/timeline.err"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print(sys.argv[1], t.get('span_us'))" "$timeline"
done

stage rounds
a=$(basename "$1" .py) b=$(basename "$2" .py)
bench_rounds "$out/rounds" "${ROUNDS:-3}" "" "$a" "$1" "$b" "$2" --model-config "$dir/config.json" \
    --weight-dir "$dir" --device cuda --cases large --case decode_1x128x64 --step-time
python3 -m tools.versus_recipe "$out/rounds" --engine "$a" --baseline "$b" | tee "$out/versus.txt"
stage done

#!/usr/bin/env bash
# Issue 61's batch-1 decode step on one GPU, engine against engine, on 4 layers of
# Qwen3-30B-A3B's width (random bf16, target/hf_checkpoints.py):
#   bash tools/gpu/moe_batch1.sh OUT ENGINE_A ENGINE_B [ENGINE ...]
# 1. the MoE kernels and recipes on the GPU (tests/test_gpu.py -k moe), the
#    MoE part alone at the allele's defaults (tools.probes.moe_layer_bench --quick), and
#    ENGINE_A's logits against transformers fp32 (tools.matches_transformers);
# 2. each engine's batch-1 step kernel by kernel (tools.probes.step_timeline), a line each:
#    the span and each kernel's adds a layer;
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
  python3 - "$timeline" <<'PY'
import json, sys  # the span, then each kernel's adds a layer (us), by kernel and the one before it
t = json.load(open(sys.argv[1]))
adds = {}
for label, row in t.get("kernels", {}).items():
    if row["per_step"] >= 3:  # run by every layer (4), not by the step's ends
        name = " < ".join(n.strip().removesuffix("_kernel")[:16] for n in label.split("<")[:2])
        adds[name] = adds.get(name, 0.0) + row["step_add_us"] / 4
print(sys.argv[1], t.get("span_us"), "; ".join(f"{k} {v:.2f}" for k, v in sorted(adds.items(), key=lambda kv: -kv[1])))
PY
done

stage rounds
a=$(basename "$1" .py) b=$(basename "$2" .py)
bench_rounds "$out/rounds" "${ROUNDS:-3}" "" "$a" "$1" "$b" "$2" --model-config "$dir/config.json" \
    --weight-dir "$dir" --device cuda --cases large --case decode_1x128x64 --step-time
python3 -m tools.versus_recipe "$out/rounds" --engine "$a" --baseline "$b" | tee "$out/versus.txt"
# At most 8 files come back from the device: the timelines and rounds go in one archive.
tar czf "$out/timelines_rounds.tgz" -C "$out" rounds $(cd "$out" && ls timeline_*.json) && rm -rf "$out/rounds" "$out"/timeline_*.json
stage done

#!/usr/bin/env bash
# Issue 27 on one GPU (one device command may run 10 minutes): random bf16 checkpoints of
# Llama-3.2-1B's and Qwen3-0.6B's shapes (target/hf_checkpoints.py), our engines beside
# transformers on them. $RECIPES: recipe files to build and measure (default: the fastest);
# $ENGINES: engine files measured as well (a search's winner). $MODELS: which checkpoints
# (default: llama_3_2_1b qwen3_0_6b); WITH_SEED=0 leaves the seed out. safetensors and transformers (with its dependencies)
# must be among the carried wheels.
#   bash tools/gpu/hf.sh check OUT         # the bf16 gate (calibrated allowance) on each, seed too
#   bash tools/gpu/hf.sh bench OUT         # fitness bench --cases large --roofline --step-time of each, seed too
#   bash tools/gpu/hf.sh transformers OUT  # transformers eager, then static cache + torch.compile
#   bash tools/gpu/hf.sh profile OUT       # kernels and GPU time of the batch-1 and batch-64 decodes and the 16 x 1024 prefill
set -uo pipefail
mode=$1 out=$2; mkdir -p "$out"
source tools/gpu/env.sh
MODELS=${MODELS:-llama_3_2_1b qwen3_0_6b}
engines="${ENGINES:-}"
[ "${WITH_SEED:-1}" = 0 ] || engines="$engines seed_engine/engine.py"
for recipe in ${RECIPES:-mutations/recipes/fastest.txt}; do
  name=$(basename "$recipe" .txt)
  python3 -m mutations recipe "$recipe" -o "/tmp/$name.py" > /dev/null || exit 1
  engines="/tmp/$name.py $engines"
done
for model in $MODELS; do
  dir=/tmp/hf/$model
  [ -f "$dir/config.json" ] || python3 -m target.hf_checkpoints /tmp/hf --only "$model" > /dev/null || exit 1
  case $mode in
  check)
    for engine in $engines; do
      python3 -m fitness check --engine "$engine" --model-config "$dir/config.json" --weight-dir "$dir" \
        --device cuda | head -c 600 | tee -a "$out/check.txt"; echo
    done ;;
  bench)
    for engine in $engines; do
      python3 -m fitness bench --engine "$engine" --model-config "$dir/config.json" --weight-dir "$dir" \
        --device cuda --cases large --roofline --step-time \
        | tee "$out/${model}_$(basename "$engine" .py).json" | python3 -m tools.bench_line "$model $engine"
    done | tee -a "$out/bench.txt" ;;
  profile)
    for engine in $engines; do
      python3 -m tools.profile_case --engine "$engine" --model-config "$dir/config.json" --weight-dir "$dir" \
        --cases large --case decode_1x128x64 --case decode_64x256x64 --case prefill_16x1024 --top 12 \
        | sed "s|^|$model $(basename "$engine" .py) |" | tee -a "$out/profile.txt"
    done ;;
  transformers)
    for how in eager compiled; do
      python3 -m tools.transformers_bench "$dir" --mode "$how" | sed "s/^/$model /" | tee -a "$out/transformers.txt"
    done ;;
  esac
done

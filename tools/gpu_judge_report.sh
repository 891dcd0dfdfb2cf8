#!/usr/bin/env bash
# Issue 2 on the GPU machine, in one call: the seed and the recompute baseline checked on
# the public and derived configs, benchmarked beside the roofline, and the GPU-only tests.
# Usage (repo root): bash tools/gpu_judge_report.sh OUT_DIR
set -uo pipefail
out=${1:-gpu_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
python3 -m target.toy_weights
T="--model-config target/model_config.json --weight-dir target/weights --device cuda"
for engine in seed_engine/engine.py fitness/baselines/recompute_engine.py; do
  name=$(basename "$(dirname "$engine")")
  echo "== check $engine"; python3 -m fitness check --engine "$engine" $T --seed 2026 --scratch /tmp/judge_w | tee "$out/check_$name.json"
done
echo "== bench seed (all cases)"; python3 -m fitness bench --engine seed_engine/engine.py $T --cases all --roofline | tee "$out/bench_seed.json"
echo "== bench recompute (public)"; python3 -m fitness bench --engine fitness/baselines/recompute_engine.py $T --cases public --roofline | tee "$out/bench_recompute.json"
echo "== roofline"; python3 -m fitness roofline --model-config target/model_config.json --gpu h100 --cases all | tee "$out/roofline.txt"
echo "== judge seed in the sandbox"; python3 -m fitness judge seed_engine/engine.py --model-config target/model_config.json --weight-dir target/weights --device cuda --bench all --scratch /tmp/judge_w | tee "$out/judge_seed.json" | python3 -c "import json,sys; v=json.load(sys.stdin); print(v['status'], v['worst_ratio'], v['seconds'], v['tokens_per_second'])"
echo "== GPU tests"; python3 -m pytest -q tests/test_gpu.py 2>&1 | tee "$out/pytest_gpu.txt" | tail -5

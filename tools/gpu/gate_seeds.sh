#!/usr/bin/env bash
# The gate on the GPU across token seeds, for a change to what it checks (the tie bound, the
# derived configs): the hand recipes judged on the tiny MoE checkpoints under each seed, the
# hybrid's planted faults, and the MoE GPU tests. One line per judgement: status, stage,
# worst of the limit, its case, the error's start.
#   bash tools/gpu/gate_seeds.sh OUT    # env: SEEDS (1 2 5: where one tie bound for every layer
#       # left a hybrid config under half its rows on a CPU); about 45 s a judgement
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
python3 -m target.hf_checkpoints /tmp/hf --only tiny_qwen3_5_moe --only tiny_qwen3_moe > /dev/null || exit 1
programs=/tmp/programs; mkdir -p $programs
for recipe in qwen3_5_by_hand qwen3_moe_by_hand; do
  python3 -m mutations recipe mutations/recipes/$recipe.txt -o $programs/$recipe.py > /dev/null || exit 1
done
for pair in qwen3_5_by_hand:tiny_qwen3_5_moe qwen3_moe_by_hand:tiny_qwen3_moe; do
  program=${pair%:*} model=/tmp/hf/${pair#*:}
  for seed in ${SEEDS:-1 2 5}; do
    python3 -m fitness judge $programs/$program.py --model-config $model --weight-dir $model --device cuda \
        --bench none --seed $seed > "$out/$program.$seed.json" 2>> "$out/judge.err"
    python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(sys.argv[2], 'seed', sys.argv[3], v['status'], \
v['stage'], v['worst_ratio'], v['worst_case'], (v.get('error') or '')[:200])" "$out/$program.$seed.json" $program $seed
  done
done | tee "$out/judged.txt"
python3 -m tools.probes.planted_in_bf16 /tmp/hf/tiny_qwen3_5_moe --device cuda 2>&1 | tee "$out/planted.txt"
python3 -m pytest -q tests/test_gpu.py -k moe 2>&1 | tail -5 | tee "$out/test_gpu_moe.txt"

#!/usr/bin/env bash
# The gate on the GPU across token seeds, for a change to what it checks (the tie bound, the
# derived configs): the hand recipes judged on the tiny MoE checkpoints under each seed, the
# hybrid's planted faults, the MoE GPU tests, and the dense programs on the bf16 targets
# (fastest.txt's and the library's Qwen3 program on Qwen3-0.6B's shape, fastest.txt's on the
# bf16 toy target). One line per judgement: program, model, seed, status, stage, worst of the
# limit, its case, the error's start. The seed and the hybrid hand recipe are judged on HYBRID's
# checkpoint, and its planted faults with them (qwen3_5_35b_a3b_4_layers: the real width, where
# the fp16 config's margin over the quiet faults was imitated on a CPU only). LANES (3)
# judgements at a time (--bench none: nothing timed; 17 at once on 16 cores timed every one
# out, importing and compiling for 90 s and more).
#   bash tools/gpu/gate_seeds.sh OUT    # env: SEEDS (1 2 5: where one tie bound for every layer
#       # left a hybrid config under half its rows on a CPU), LANES, ONLY (a pattern: the
#       # judgements whose line has it), JUDGE_ONLY (1: no faults, no tests), HYBRID (a
#       # target.hf_checkpoints name; tiny_qwen3_5_moe), FAULTS (names of the planted faults,
#       # ';' between: those alone), NO_TESTS (1: no MoE tests);
#       # LANES=1 at a real width: three judges at Qwen3.5-35B-A3B's filled the 64 GiB disk
#       # (each writes its derived configs' weights) and the GPU (~50 GB each);
#       # about 45 s a judgement alone
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
export OMP_NUM_THREADS=1
hybrid=${HYBRID:-tiny_qwen3_5_moe}
python3 -m target.hf_checkpoints /tmp/hf --device cuda --only "$hybrid" --only tiny_qwen3_moe --only qwen3_0_6b \
    > /dev/null || exit 1
python3 -m target.targets /tmp/configs --only bf16 > /dev/null || exit 1; bf16=/tmp/configs/bf16
programs=/tmp/programs; mkdir -p $programs
for recipe in qwen3_5_by_hand qwen3_moe_by_hand fastest h100_20261127_2359b8da; do
  python3 -m mutations recipe mutations/recipes/$recipe.txt -o $programs/$recipe.py > /dev/null || exit 1
done
cp seed_engine/engine.py $programs/seed.py
judge() {  # PROGRAM MODEL_NAME CONFIG WEIGHT_DIR SEED [flags]: one line
  local program=$1 name=$2 config=$3 weights=$4 seed=$5; shift 5
  local file=$out/$program.$name.$seed.json
  python3 -m fitness judge $programs/$program.py --model-config "$config" --weight-dir "$weights" --device cuda \
      --bench none --vouch --seed "$seed" "$@" > "$file" 2> "$file.err"
  python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(*sys.argv[2:], v['status'], v['stage'], \
v['worst_ratio'], v['worst_case'], (v.get('error') or '')[:200])" "$file" "$program" "$name" "seed $seed" \
      || echo "$program $name seed $seed: no verdict ($(tail -1 "$file.err"))"
}
export -f judge; export out programs
{
  for seed in ${SEEDS:-1 2 5}; do
    for program in seed qwen3_5_by_hand; do echo $program "$hybrid" /tmp/hf/"$hybrid" /tmp/hf/"$hybrid" "$seed"; done
    echo qwen3_moe_by_hand tiny_qwen3_moe /tmp/hf/tiny_qwen3_moe /tmp/hf/tiny_qwen3_moe "$seed"
  done
  for program in fastest h100_20261127_2359b8da; do echo $program qwen3_0_6b /tmp/hf/qwen3_0_6b /tmp/hf/qwen3_0_6b 1; done
  echo fastest bf16 "$bf16/model_config.json" "$bf16/weights" 1 --margin 4
} | grep -e "${ONLY:-.}" | xargs -P "${LANES:-3}" -L 1 bash -c 'judge "$@"' _ | tee "$out/judged.txt"
[ -n "${JUDGE_ONLY:-}" ] && exit 0
faults=(); [ -n "${FAULTS:-}" ] && { IFS=';' read -ra names <<< "$FAULTS"; faults=(--only "${names[@]}"); }
python3 -m tools.probes.planted_in_bf16 /tmp/hf/"$hybrid" --device cuda ${faults[@]+"${faults[@]}"} 2>&1 | tee "$out/planted.txt"
[ -n "${NO_TESTS:-}" ] && exit 0
python3 -m pytest -q tests/test_gpu.py -k moe 2>&1 | tail -5 | tee "$out/test_gpu_moe.txt"

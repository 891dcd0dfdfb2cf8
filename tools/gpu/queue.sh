#!/usr/bin/env bash
# Jobs run one after another on one GPU in the background (setsid), so they outlive the
# device call that starts them: a 20-minute search and its comparison on one card, the
# server's sweep on the other. Read them from later calls with tools/gpu/follow.sh.
#   bash tools/gpu/queue.sh STATE GPU JOB ...
# The repository is copied to STATE/repo when no queue of STATE runs (a later call re-sends the
# working tree; running jobs keep theirs). Each job's output goes to STATE/queueGPU.log, and
# STATE/queueGPU.done appears when the last has ended. Jobs:
#   search:TARGET[:BUDGET[:NAME[:SEED]]]  bash run.sh on TARGET ("public": the toy model) -> STATE/NAME
#                             (default TARGET: name each of several runs of one target, then
#                             compare:NAME:TARGET); SEED, an engine file: --seed-from SEED
#   seed_only:TARGET:BUDGET   the same from the seed alone (--from-seed-only) -> STATE/TARGET_seed_only
#   compare:NAME[:TARGET]     STATE/NAME's winner against the recipe, COMPARE_ROUNDS (3) rounds (up to
#                             COMPARE_MAX_ROUNDS, 6, while undecided)
#   serve                     tools/gpu/serve.sh -> STATE/serve
#   replicas                  tools/gpu/replicas.sh (--replicas 1 against every GPU, interleaved) -> STATE/replicas
#   hf_search:MODEL[:BUDGET]  bash run.sh --model on target.hf_checkpoints' MODEL (llama_3_2_1b,
#                             qwen3_0_6b) -> STATE/hf_MODEL
#   hf_seed_only:MODEL[:BUDGET]  the same from the seed alone (--from-seed-only) -> STATE/hf_MODEL_seed_only
#                             (both: screens on SCREEN_BENCH's cases, default large; HF_FLAGS, more run.sh
#                             flags, e.g. "--seed-from /tmp/dense.py")
#   hf_compare:NAME[:RECIPE]  STATE/NAME's winner (NAME: hf_MODEL or hf_MODEL_seed_only) against RECIPE's
#                             program (a file of mutations/recipes/, default fastest.txt) on MODEL's checkpoint
#                             and its large cases, 3 rounds (up to 6 while undecided), the order swapped each
#                             round, then the ratio per case -> STATE/NAME/compare_RECIPE.txt
#   hf:MODE[:MODEL]           tools/gpu/hf.sh MODE (check, bench, profile, transformers) -> STATE/hf, on
#                             MODEL alone (default both), with STATE/hf_MODEL's winner beside the recipe
#   gpu_tests[:EXPR]          python -m pytest tests/test_gpu.py [-k EXPR] -> STATE/gpu_tests.txt
#   try:ENGINE[:TARGET]       an engine file not on main (a branch's recipe, built beforehand into the
#                             working tree): fitness check on the toy model with every derived config
#                             (bf16 among them) and hf.sh check on both real shapes, then on each
#                             shape TRY_ROUNDS (2) rounds of the recipe and it benched in turn, the order
#                             swapped each round, and the ratio per case (tools.versus_recipe)
#                             -> STATE/try_NAME.txt, STATE/hf, STATE/try_NAME/MODEL/ROUND.{recipe,try}.json;
#                             with a TARGET of target.targets (bf16, one_b, ...), the same on it alone, with
#                             its run.sh flags (margin, cases) -> STATE/try_NAME_TARGET.txt, STATE/try_NAME/TARGET
#   probe:NAME                python -m tools.probes.NAME -> STATE/probe_NAME.txt
#   fresh_runs:TARGET[:keep_caches]  each fresh engine's run apart (tools.probes.fresh_runs), fastest.txt's
#                             program on TARGET of target.targets, its run.sh cases (keep_caches: captures
#                             leave the allocator's caches) -> STATE/fresh_runs_TARGET.jsonl
#   create:TARGET             what making the seed's and the recipe's engines costs on TARGET
#                             against running a case (tools.engine_creation_cost) -> STATE/create_TARGET.json
#   overhead:RECIPE           where a timed run's time goes for RECIPE's program on the toy model
#                             (tools.timed_run_overhead, OVERHEAD_VARIANTS, default bench go go_no_wire
#                             go_device_inputs, OVERHEAD_ROUNDS 7, OVERHEAD_CASES default all, --timeline)
#                             -> STATE/overhead_RECIPE.txt,
#                             each call's timeline in STATE/timeline_RECIPE.json
#   judge_vs_evaluator[:NAME] tools/gpu/judge_vs_evaluator.sh without its overhead part (ROUNDS, JUDGE_ROUNDS,
#                             WITH_SEED, RECIPES as there) -> STATE/NAME (default judge_vs_evaluator)
#   wait:FILE                 until STATE/FILE exists, so that comparisons run once the searches beside
#                             them have ended: queue1.done (queue 1's end) or queue1.job1.done (its first
#                             job's end, failed or not)
set -uo pipefail
state=$1 gpu=$2; shift 2
mkdir -p "$state"
# A host may keep /tmp from an earlier session: its copy of the repository, once no queue of
# STATE still runs, is stale, and so are this queue's done files (follow.sh would return at once).
running=0
for pid in "$state"/queue*.pid; do [ -e "$pid" ] && kill -0 "$(cat "$pid")" 2> /dev/null && running=1; done
[ "$running" = 0 ] && rm -rf "$state/repo"
rm -f "$state/queue$gpu.done" "$state/queue$gpu".job*.done
[ -d "$state/repo" ] || cp -a . "$state/repo"
cd "$state/repo" || exit 1
source tools/gpu/env.sh > /dev/null  # the wheels once, before two queues could race for them
source tools/gpu/bench_rounds.sh

# STATE/NAME's winner against a recipe's program on the checkpoint NAME was searched on, paired.
hf_compare() {
  local name=$1 recipe=$2 model=${1#hf_}; model=${model%_seed_only}
  local dir=/tmp/hf/$model out=$state/$1 label=${2%.txt}
  [ -f "$out/winner.py" ] || { echo "no winner in $out"; return 1; }
  python3 -m mutations recipe "mutations/recipes/$recipe" -o "$out/$label.py" > /dev/null || return 1
  BENCH_MAX_ROUNDS=6 bench_rounds "$out/compare_$label" 3 "" winner "$out/winner.py" "$label" "$out/$label.py" \
    --model-config "$dir/config.json" --weight-dir "$dir" --device cuda --cases large | tee "$out/compare_$label.txt"
  python3 -m tools.versus_recipe "$out/compare_$label" --engine winner --baseline "$label" | tee -a "$out/compare_$label.txt"
}

run_job() {
  local kind target budget name seed
  IFS=: read -r kind target budget name seed <<< "$1"
  local search=tools/gpu/search_vs_recipe.sh
  case $kind in
  search) SEARCH_LIMIT=0 bash $search search "$state/${name:-$target}" "$target" ${budget:+--budget "$budget"} \
            ${seed:+--seed-from "$seed"} ;;
  seed_only) SEARCH_LIMIT=0 bash $search search "$state/${target}_seed_only" "$target" --from-seed-only \
               ${budget:+--budget "$budget"} ;;
  compare) bash $search compare "$state/$target" "${budget:-$target}" "${COMPARE_ROUNDS:-3}" ;;
  serve) bash tools/gpu/serve.sh "$state/serve" ;;
  replicas) local gpus; gpus=$(nvidia-smi -L | wc -l)
            COUNTS="${COUNTS:-1 $gpus 1 $gpus}" bash tools/gpu/replicas.sh "$state/replicas" ;;
  hf_search) local dir=/tmp/hf/$target
             [ -f "$dir/config.json" ] || python3 -m target.hf_checkpoints /tmp/hf --only "$target" > /dev/null || return 1
             # Judged on the cases issue 27 measures (batch-1 and batch-64 decode, 16 x 1024 prefill).
             SEARCH_LIMIT=0 bash $search search "$state/hf_$target" public --model "$dir" --bench large \
               --screen-bench "${SCREEN_BENCH:-large}" ${HF_FLAGS:-} ${budget:+--budget "$budget"} ;;
  hf_seed_only) local dir=/tmp/hf/$target
                [ -f "$dir/config.json" ] || python3 -m target.hf_checkpoints /tmp/hf --only "$target" > /dev/null || return 1
                SEARCH_LIMIT=0 bash $search search "$state/hf_${target}_seed_only" public --model "$dir" --from-seed-only \
                  --bench large --screen-bench "${SCREEN_BENCH:-large}" ${HF_FLAGS:-} ${budget:+--budget "$budget"} ;;
  hf_compare) hf_compare "$target" "${budget:-fastest.txt}" ;;
  hf) local mode=$target model=$budget  # hf:MODE[:MODEL]
      local winner=$state/hf_$model/winner.py
      WITH_SEED=0 MODELS="${model:-llama_3_2_1b qwen3_0_6b}" ENGINES="$([ -n "$model" ] && [ -f "$winner" ] && echo "$winner")" \
        bash tools/gpu/hf.sh "$mode" "$state/hf" ;;
  gpu_tests) python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py ${target:+-k "$target"} 2>&1 \
               | tee "$state/gpu_tests.txt" | tail -5 ;;
  try) local name; name=$(basename "$target" .py)
       python3 -m mutations recipe mutations/recipes/fastest.txt -o "$state/recipe.py" > /dev/null || return 1
       [ -n "$budget" ] && { try_target "$target" "$budget" "$name"; return; }
       # The whole verdict to the file, its head to the log (head first would cut tee off short).
       python3 -m fitness check --engine "$target" --model-config target/model_config.json \
         --weight-dir target/weights --device cuda > "$state/try_$name.txt" 2>&1
       head -c 600 "$state/try_$name.txt"; echo
       WITH_SEED=0 RECIPES=" " ENGINES="$target" bash tools/gpu/hf.sh check "$state/hf" || return 1
       for model in llama_3_2_1b qwen3_0_6b; do
         try_rounds "$state/try_$name/$model" "$target" "$model" --model-config "/tmp/hf/$model/config.json" \
           --weight-dir "/tmp/hf/$model" --device cuda --cases large --roofline --step-time
       done ;;
  probe) python3 -m "tools.probes.$target" 2>&1 | tee "$state/probe_$target.txt" | tail -20 ;;
  fresh_runs) target_of "$target" || return 1  # fresh_runs:TARGET:keep_caches -> --keep-caches
              python3 -m mutations recipe mutations/recipes/fastest.txt -o "$state/recipe.py" > /dev/null || return 1
              python3 -m tools.probes.fresh_runs --engine "$state/recipe.py" --model-config "$target_dir/model_config.json" \
                --weight-dir "$target_dir/weights" --cases "$target_cases" ${budget:+--${budget//_/-}} \
                | tee -a "$state/fresh_runs_$target.jsonl" ;;
  create) target_of "$target" || return 1
          python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py > /dev/null || return 1
          python3 -m tools.engine_creation_cost --engines seed_engine/engine.py /tmp/fastest.py \
            --model-config "$target_dir/model_config.json" --weight-dir "$target_dir/weights" \
            | tee "$state/create_$target.json" ;;
  overhead) python3 -m mutations recipe "mutations/recipes/$target.txt" -o "$state/$target.py" > /dev/null || return 1
            python3 -m tools.timed_run_overhead --engine "$state/$target.py" --model-config target/model_config.json \
              --weight-dir target/weights --device cuda --rounds "${OVERHEAD_ROUNDS:-7}" --timeline \
              --variants ${OVERHEAD_VARIANTS:-bench go go_no_wire go_device_inputs} \
              $(for case in ${OVERHEAD_CASES:-}; do echo --case "$case"; done) \
              --timeline-json "$state/timeline_$target.json" 2>&1 | tee "$state/overhead_$target.txt" ;;
  judge_vs_evaluator) OVERHEAD=0 bash tools/gpu/judge_vs_evaluator.sh "$state/${target:-judge_vs_evaluator}" ;;
  wait) until [ -e "$state/$target" ]; do sleep 10; done ;;
  *) echo "unknown job $1"; return 2 ;;
  esac
}

try_rounds() {  # ROUNDS_DIR ENGINE LABEL BENCH_FLAGS...: the recipe and ENGINE in turn, then the ratios
  local rounds=$1 engine=$2 label=$3; shift 3
  bench_rounds "$rounds" "${TRY_ROUNDS:-2}" "$label" recipe "$state/recipe.py" try "$engine" "$@"
  python3 -m tools.versus_recipe "$rounds" --engine try --baseline recipe
}

try_target() {  # ENGINE TARGET NAME: the try: job on one target of target.targets
  local engine=$1 target=$2 name=$3 flags cases=all
  flags=$(python3 -m target.targets --run-flags "$target") || return 1
  mapfile -t flags <<< "$flags"  # one flag or value a line
  local paths=("${flags[@]:0:4}") margin=() i  # --model-config C --weight-dir W, then the rest
  for (( i = 4; i < ${#flags[@]}; i++ )); do
    case ${flags[i]} in
    --margin) margin=(--margin "${flags[i + 1]}") ;;
    --bench) cases=${flags[i + 1]} ;;
    esac
  done
  python3 -m fitness check --engine "$engine" "${paths[@]}" "${margin[@]}" --device cuda \
    > "$state/try_${name}_$target.txt" 2>&1
  head -c 600 "$state/try_${name}_$target.txt"; echo
  try_rounds "$state/try_$name/$target" "$engine" "$target" "${paths[@]}" --device cuda --cases "$cases"
}

queue() {
  set -o pipefail
  local job index=0
  for job in "$@"; do
    echo "== $(date +%T) $job"
    run_job "$job"
    local status=$?  # before the echo's own $(date) replaces it
    echo "== $(date +%T) $job ended: $status"
    touch "$state/queue$gpu.job$(( ++index )).done"
  done
  touch "$state/queue$gpu.done"
}
export -f run_job hf_compare try_rounds try_target bench_rounds target_of queue
export state gpu
CUDA_VISIBLE_DEVICES=$gpu setsid bash -c 'queue "$@"' queue "$@" > "$state/queue$gpu.log" 2>&1 < /dev/null &
echo $! > "$state/queue$gpu.pid"
echo "queue $gpu started: $* (log $state/queue$gpu.log)"

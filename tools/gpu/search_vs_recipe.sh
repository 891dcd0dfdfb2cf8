#!/usr/bin/env bash
# A search on one GPU, then its winner against the recipe's program (fastest.txt) on the same
# target, per case. One device command may run 10 minutes, so a longer search goes over
# several: each `search` call runs until the search ends or SEARCH_LIMIT seconds pass (540;
# then it is stopped, and the next call resumes it, on the same warm machine). SEARCH_LIMIT=0
# lets it run to its end: start it under setsid and read OUT/run_sh.log from later calls.
# Each OUT keeps its own history, runs and library, so two searches can share a host, one
# per GPU (CUDA_VISIBLE_DEVICES).
#   bash tools/gpu/search_vs_recipe.sh search OUT [TARGET] [run.sh flags ...]
#       # bash run.sh [--target TARGET] FLAGS (TARGET "public": the repository's own model),
#       # or the rest of OUT's unfinished run; its log, winner and recipe go to OUT
#   bash tools/gpu/search_vs_recipe.sh compare OUT [TARGET] [ROUNDS]
#       # OUT's winner and fastest.txt's program benched in fresh processes, interleaved (the
#       # order swapped each round), ROUNDS (3) times on the cases the search timed, and more
#       # while a case is undecided, up to COMPARE_MAX_ROUNDS (6); the ratio per case with its
#       # ~95% interval (tools/versus_recipe.py)
set -uo pipefail
mode=$1 out=$2 target=${3:-public}; mkdir -p "$out"
shift $(( $# < 3 ? $# : 3 ))
source tools/gpu/env.sh
source tools/gpu/bench_rounds.sh
target_args=()
[ "$target" = public ] || target_args=(--target "$target")

search() {
  export EVOLVE_WORKSPACE="$out/workspace" EVOLVE_HISTORY="$out/history.csv" EVOLVE_RUNS_DIR="$out/runs"
  local limit=${SEARCH_LIMIT:-540}
  local start=$(date +%s) run_dir status
  run_dir=$(cat "$out/run_dir" 2>/dev/null)
  # Resuming, the target's flags are given again: run.sh's default config would win otherwise.
  timeout -s TERM "$([ "$limit" = 0 ] && echo infinity || echo "$limit")" bash run.sh ${run_dir:+--resume "$run_dir"} "${target_args[@]}" "$@" >> "$out/run_sh.log" 2>&1
  status=$?
  echo "run.sh exit $status after $(( $(date +%s) - start )) s"
  grep -oE "run dir [^ ]+" "$out/run_sh.log" | tail -1 | cut -d' ' -f3 > "$out/run_dir"
  grep -E "^(run |gen |winner|library|[0-9]+m[0-9]+s of the)" "$out/run_sh.log"
  if [ "$status" = 0 ]; then  # finished: nothing left to resume
    rm -f "$out/run_dir"
    cp "$EVOLVE_WORKSPACE/engine.py" "$out/winner.py"
    python3 -m evolve report "$out/history.csv" --out "$out/report" --recipe "$out/winner_recipe.txt" > "$out/report.txt" 2>&1
    tail -3 "$out/report.txt"
  fi
}

compare() {
  target_of "$target" || exit 1
  local dir=$target_dir cases=$target_cases
  # OUT's own copy: two queues' comparisons on one host would write one /tmp file at once.
  python3 -m mutations recipe mutations/recipes/fastest.txt -o "$out/recipe.py" > /dev/null || exit 1
  BENCH_MAX_ROUNDS=${COMPARE_MAX_ROUNDS:-6} bench_rounds "$out" "${1:-3}" "" winner "$out/winner.py" recipe "$out/recipe.py" \
    --model-config "$dir/model_config.json" --weight-dir "$dir/weights" --device cuda --cases "$cases" \
    | tee "$out/compare.txt"
  python3 -m tools.versus_recipe "$out" | tee -a "$out/compare.txt"
}

case $mode in
search) search "$@" ;;
compare) compare "$@" ;;
esac

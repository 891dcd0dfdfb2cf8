#!/usr/bin/env bash
# The judge against another judge on one GPU (one device command may run 10 minutes):
# $ROOTS are checkouts whose `python -m fitness` judges (default: an earlier commit
# unpacked in .before, and this one); programs are the recipe's (fastest.txt) and the seed.
#   bash tools/gpu/judge_before_after.sh judged OUT [REPEATS]  # each program judged by each
#                  # root, interleaved: tokens/s per public case, the judgement's seconds
#   bash tools/gpu/judge_before_after.sh overhead OUT          # the judge's run against the
#                  # benchmark's clock, per case (tools.timed_run_overhead: bench, go, judge)
#   bash tools/gpu/judge_before_after.sh cheats OUT            # tools.cheat_verdicts by each root
set -uo pipefail
mode=$1 out=$2; mkdir -p "$out"
source tools/gpu/env.sh
here=$PWD
ROOTS=${ROOTS:-.before .}
python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py > /dev/null || exit 1
programs=${PROGRAMS:-"/tmp/fastest.py $here/seed_engine/engine.py"}
case $mode in
judged)
  for repeat in $(seq 1 "${3:-2}"); do
    for program in $programs; do
      for root in $ROOTS; do
        name="$(basename "$root")_$(basename "$program" .py)_$repeat"
        (cd "$root" && python3 -m fitness judge "$program" --model-config "$here/target/model_config.json" \
          --weight-dir "$here/target/weights" --device cuda) > "$out/$name.json"
        python3 -c "import json, sys; v = json.load(open(sys.argv[1]))
print(sys.argv[2], v['status'], {k: round(x) for k, x in (v.get('tokens_per_second') or {}).items()},
      'rounds', v.get('rounds'), 'cv', v.get('fitness_cv') and round(v['fitness_cv'], 3), 'seconds', v['seconds'],
      {k: x for k, x in v['phases'].items() if k in ('gate', 'timing', 'runner_go', 'runner_call')})" \
          "$out/$name.json" "$name"
      done
    done
  done | tee "$out/judged.txt" ;;
overhead)
  for root in $ROOTS; do
    for program in $programs; do
      (cd "$root" && python3 -m tools.timed_run_overhead --engine "$program" --model-config "$here/target/model_config.json" \
        --weight-dir "$here/target/weights" --rounds ${OVERHEAD_ROUNDS:-7} --variants ${VARIANTS:-bench go judge} 2>&1 | sed "s|^|$root |")
    done
  done | tee "$out/overhead.txt" ;;
cheats)
  for root in $ROOTS; do
    echo "judge of $root"
    python3 -m tools.cheat_verdicts --judge-root "$root" --device cuda --bench public --json "$out/cheats_$(basename "$root").json"
  done | tee "$out/cheats.txt" ;;
esac

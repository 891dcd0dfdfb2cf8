#!/usr/bin/env bash
# The judge's ranking against the evaluator's on one GPU (issue 58): the public target's
# library programs and the seed beside fastest.txt's (tools.judge_vs_evaluator), then where
# a judged run's time goes for two of them (tools.timed_run_overhead: bench, go, judge).
#   bash tools/gpu/judge_vs_evaluator.sh OUT    # env: ROUNDS (3), JUDGE_ROUNDS (6), RECIPES,
#       WITH_SEED (1: the seed among the programs), VARIANTS (timed_run_overhead's: bench go judge;
#       OVERHEAD=0 leaves that part out; STAGED=1: the group judged with staged runs too)
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
programs=/tmp/programs; mkdir -p $programs
for recipe in fastest ${RECIPES:-h100_20261125_e7c360ba h100_20261125_58dd1268 h100_20261125_5a926216}; do
  python3 -m mutations recipe mutations/recipes/$recipe.txt -o $programs/$recipe.py > /dev/null || exit 1
done
[ "${WITH_SEED:-1}" = 1 ] && cp seed_engine/engine.py $programs/seed.py
python3 -m tools.judge_vs_evaluator --baseline $programs/fastest.py $(ls $programs/*.py | grep -v fastest) \
  --rounds "${ROUNDS:-3}" --judge-rounds "${JUDGE_ROUNDS:-6}" --judge-orders "${JUDGE_ORDERS:-2}" --device cuda \
  ${STAGED:+--staged} \
  --json "$out/judge_vs_evaluator.json" 2>&1 | tee "$out/judge_vs_evaluator.txt"
[ "${OVERHEAD:-1}" = 0 ] && exit 0
for program in fastest h100_20261125_e7c360ba; do
  python3 -m tools.timed_run_overhead --engine $programs/$program.py $T --rounds 5 --variants ${VARIANTS:-bench go judge} 2>&1
done | tee "$out/overhead.txt"

#!/usr/bin/env bash
# A search and its judge on one GPU (one device command may run 10 minutes):
#   bash tools/gpu/search.sh search OUT [BUDGET]   # bash run.sh --budget BUDGET (8m), its report
#   bash tools/gpu/search.sh compare OUT [ROUNDS]  # winner (or $ENGINES), fastest.txt's program
#                                                   # and the seed, each benched in a fresh
#                                                   # process, interleaved
#   bash tools/gpu/search.sh all OUT BUDGET ROUNDS # the two, one after the other
#   bash tools/gpu/search.sh judge OUT [WORKERS..]  # engine creation; the seed judged 5 times
#                                                   # (its CV); judgements a minute, one by one
#                                                   # and in groups of 4, with each worker count
set -uo pipefail
mode=$1 out=$2; mkdir -p "$out"
source tools/gpu/env.sh
search() {
  start=$(date +%s)
  timeout 580 bash run.sh --budget "$1" > "$out/run_sh.log" 2>&1; echo "run.sh exit $? in $(( $(date +%s) - start )) s"
  grep -E "^(run |gen |winner)" "$out/run_sh.log"
  cp workspace/results.log history.csv workspace/engine.py "$out"/
  python3 -m evolve report history.csv --out /tmp/report --recipe "$out/winner_recipe.txt" > "$out/report.txt" 2>&1
  python3 - <<'PY'
import pandas as pd
h = pd.read_csv("history.csv")
judged = h[h["status"] != "declined"]
t = pd.to_datetime(judged["timestamp"])
minutes = max((t.max() - t.min()).total_seconds() / 60, 1e-9)
confirms, finals = ((judged["operator"] == name).sum() for name in ("confirm", "final"))
print(f"judgements {len(judged)} ({confirms} confirms, {finals} final) over {minutes:.1f} min: "
      f"{len(judged) / minutes:.1f} per minute; mean judge_seconds {judged['judge_seconds'].mean():.1f}")
print(judged.groupby("level")["judge_seconds"].describe()[["count", "mean", "50%", "max"]].round(1).to_string())
PY
}
compare() {
  ENGINES=${ENGINES:-workspace/engine.py}
  python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py
  for round in $(seq 1 "$1"); do
    for engine in $ENGINES /tmp/fastest.py seed_engine/engine.py; do
      python3 -m fitness bench --engine "$engine" $T --cases public | python3 -m tools.bench_line "$round $engine"
    done
  done | tee "$out/compare.txt"
  python3 -m fitness check --engine "${ENGINES%% *}" $T | head -12
}
judge() {
  python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py > /dev/null
  python3 -m tools.engine_creation_cost --engines seed_engine/engine.py /tmp/fastest.py | tee "$out/create.txt"
  python3 -m tools.judge_probe --engines seed_engine/engine.py --repeats 5 | tee "$out/seed_cv.txt"
  for group in 1 4; do
    python3 -m tools.judge_throughput --engine /tmp/fastest.py --judgements 8 --group $group --workers "$@"
  done | tee "$out/throughput.txt"
}
case $mode in
search) search "${3:-8m}" ;;
compare) compare "${3:-3}" ;;
all) search "$3"; compare "$4" ;;
judge) shift 2; judge "${@:-1}" ;;
esac

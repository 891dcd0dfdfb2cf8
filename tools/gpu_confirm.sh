#!/usr/bin/env bash
# One device call: the kept winner checked under three fresh token seeds, seed vs recompute
# re-benched (two interleaved rounds), and a short run.sh end to end.
#   bash tools/gpu_confirm.sh OUT WINNER.py [RUN_SH_BUDGET]
set -uo pipefail
out=$1 winner=$2; mkdir -p "$out"
source tools/gpu_env.sh
for s in 11 22 33; do
  python3 -m fitness check --engine "$winner" $T --seed $s --scratch /tmp/w > "$out/check_winner_$s.json"
  python3 -c "import json; r=json.load(open('$out/check_winner_$s.json')); print('check winner seed $s', r['status'], r.get('worst_error_ratio'), r.get('configs', r.get('errors')))"
done
for round in 1 2; do for engine in seed_engine/engine.py fitness/baselines/recompute_engine.py; do
  python3 -m fitness bench --engine $engine $T --cases public --roofline |
    python3 -c "import json,sys; print('$round $engine', [(r['case_name'], round(r['tokens_per_second']), round(r['decode_tokens_per_second'])) for r in json.load(sys.stdin)])"
done; done
start=$(date +%s); bash run.sh --budget "${3:-4m}" > "$out/run_sh.log" 2>&1; echo "run.sh exit $? in $(( $(date +%s) - start )) s"
tail -12 workspace/results.log; cp workspace/results.log "$out/"

#!/usr/bin/env bash
# Issue 3 on the GPU machine: every operator applied alone to the seed, judged on CUDA
# (gate with derived configs + public bench), after a re-bench of the seed beside the
# recompute baseline. The operator check outlives one device call, so it runs detached:
#   bash tools/gpu_operators_report.sh start OUT_DIR    # set up, re-bench, start the check
#   bash tools/gpu_operators_report.sh wait OUT_DIR     # wait (<= 9 min), copy results
set -uo pipefail
mode=$1 out=${2:-gpu_out}; mkdir -p "$out"
keep=/root/operators_run; mkdir -p "$keep"
source tools/gpu_env.sh
if [[ $mode == start ]]; then
  python3 -m target.toy_weights
  for round in 1 2; do
    for engine in seed_engine/engine.py fitness/baselines/recompute_engine.py; do
      echo "== round $round bench $engine"
      python3 -m fitness bench --engine "$engine" $T --cases public | tee -a "$out/rebench.json" |
        python3 -c "import json,sys; [print(r['case_name'], round(r['tokens_per_second']), round(r['decode_tokens_per_second'])) for r in json.load(sys.stdin)]"
    done
  done
  setsid nohup python3 -m tools.gpu_check $T --operators all --json "$keep/gpu_check.json" \
    > "$keep/gpu_check.log" 2>&1 < /dev/null &
  sleep 420
fi
for _ in $(seq 1 54); do pgrep -f tools.gpu_check > /dev/null || break; sleep 10; done
cp "$keep"/gpu_check.* "$out"/ 2>/dev/null
tail -60 "$keep/gpu_check.log"

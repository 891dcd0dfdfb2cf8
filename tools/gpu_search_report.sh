#!/usr/bin/env bash
# Issues 3 and 4 on the GPU machine, across device calls (one command may run 10 minutes):
#   bash tools/gpu_search_report.sh start OUT [BUDGET] [OPERATORS]  # set up, operator check, run.sh detached
#   bash tools/gpu_search_report.sh wait OUT                         # wait up to 9 minutes
#   bash tools/gpu_search_report.sh finish OUT                       # check and bench the winner, report
set -uo pipefail
mode=$1 out=${2:-gpu_out}; mkdir -p "$out"
keep=/root/search_run; mkdir -p "$keep"
source tools/gpu_env.sh
running() { pgrep -f "evolve run" > /dev/null; }
case $mode in
start)
  python3 -m target.toy_weights
  if [[ -n "${4:-}" ]]; then
    python3 -m tools.gpu_check $T --operators "$4" --json "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.log" | tail -25
  fi
  ( start=$(date +%s); setsid nohup bash run.sh --budget "${3:-20m}" > "$keep/run_sh.log" 2>&1 < /dev/null;
    echo "run.sh exit $? after $(( $(date +%s) - start )) s" >> "$keep/run_sh.log" ) &
  sleep 60; tail -5 "$keep/run_sh.log" ;;
wait)
  for _ in $(seq 1 54); do running || break; sleep 10; done
  tail -8 "$keep/run_sh.log" ;;
finish)
  for _ in $(seq 1 30); do running || break; sleep 10; done
  tail -30 "$keep/run_sh.log"
  echo "== check the winner in a fresh process"
  python3 -m fitness check --engine workspace/engine.py $T --scratch /tmp/judge_w | tee "$out/check_winner.json" | head -20
  echo "== bench winner and seed, interleaved twice"
  for round in 1 2; do for engine in workspace/engine.py seed_engine/engine.py; do
    python3 -m fitness bench --engine $engine $T --cases all --roofline > "$out/bench_${round}_$(basename $(dirname $engine)).json"
  done; done
  python3 -m evolve report history.csv --out "$keep/report" > "$out/report.txt" 2>&1; tail -40 "$out/report.txt"
  cp workspace/engine.py "$out/winner_engine.py"; cp workspace/results.log history.csv "$keep/run_sh.log" "$out/"
  tar czf "$out/report_png.tgz" -C "$keep" report ;;
esac

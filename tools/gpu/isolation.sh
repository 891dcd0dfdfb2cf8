#!/usr/bin/env bash
# Runners closed off (fitness/isolation.py) on a GPU machine.
#   bash tools/gpu/isolation.sh judged OUT [REPEATS]  # which layers hold; the recipe's program
#        # judged beside the seed with runners closed off and open, interleaved (the
#        # judgement's seconds: what the layered kernel cache costs); the cheats that write
#        # files or signal rivals
#   bash tools/gpu/isolation.sh cold OUT   # on a fresh machine: the recipe's program judged
#        # twice, closed off, from an empty kernel cache: the second reads the kernels the
#        # first compiled, which the judge promoted into the shared cache
set -uo pipefail
mode=$1 out=$2; mkdir -p "$out"
source tools/gpu/env.sh
uname -r; grep -E "CapEff|CapBnd" /proc/self/status
python3 -c "from fitness import isolation; print('layers left open:', isolation.open_here())"
python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py > /dev/null || exit 1
judged() {  # NAME ISOLATION
  RUNNER_ISOLATION=$2 python3 -m fitness judge /tmp/fastest.py --baseline seed_engine/engine.py --vouch $T \
    > "$out/$1.json" 2> "$out/$1.err"
  python3 -c "import json, sys; v = json.load(open(sys.argv[1]))
print(sys.argv[2], v['status'], v['stage'], 'ratio', v.get('ratio') and round(v['ratio'], 2), 'rounds', v.get('rounds'),
      'seconds', v['seconds'], {k: x for k, x in v['phases'].items() if k in ('gate', 'timing', 'runner_prepare')},
      v['error'][-300:])" "$out/$1.json" "$1"
}
case $mode in
judged)
  for repeat in $(seq 1 "${3:-2}"); do
    for isolation in on off; do judged "fastest_${isolation}_$repeat" "$isolation"; done
  done | tee "$out/judged.txt"
  python3 -m tools.cheat_verdicts --device cuda --bench public \
    --only kills_its_rivals rewrites_a_library slows_its_rivals rewrites_the_judge 2>&1 | tee "$out/cheats.txt" ;;
cold)
  cache=$(python3 -c "from fitness.isolation import shared_kernel_cache as c; print(c())")
  echo "kernels in $cache before: $(ls "$cache" 2>/dev/null | wc -l)"
  for repeat in 1 2; do
    judged "cold_$repeat" on
    echo "kernels after: $(ls "$cache" | wc -l)"
  done | tee "$out/cold.txt" ;;
esac

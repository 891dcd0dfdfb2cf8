#!/usr/bin/env bash
# Runners closed off (fitness/isolation.py) on a GPU machine: which layers hold there; the
# recipe's program judged beside the seed with runners closed off and open, interleaved
# (a closed-off runner compiles its Triton kernels into a cache of its own: the judgement's
# seconds say what that costs); the cheats that write files or signal rivals.
#   bash tools/gpu/isolation.sh OUT [REPEATS]
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
uname -r; grep -E "CapEff|CapBnd" /proc/self/status
python3 -c "from fitness import isolation; print('layers left open:', isolation.open_here())"
python3 -m mutations recipe mutations/recipes/fastest.txt -o /tmp/fastest.py > /dev/null || exit 1
for repeat in $(seq 1 "${2:-2}"); do
  for mode in on off; do
    name="fastest_${mode}_$repeat"
    RUNNER_ISOLATION=$mode python3 -m fitness judge /tmp/fastest.py --baseline seed_engine/engine.py $T \
      > "$out/$name.json" 2> "$out/$name.err"
    python3 -c "import json, sys; v = json.load(open(sys.argv[1]))
print(sys.argv[2], v['status'], v['stage'], 'ratio', v.get('ratio') and round(v['ratio'], 2), 'rounds', v.get('rounds'),
      'seconds', v['seconds'], {k: x for k, x in v['phases'].items() if k in ('gate', 'timing', 'runner_prepare')},
      v['error'][-300:])" "$out/$name.json" "$name"
  done
done | tee "$out/judged.txt"
python3 -m tools.cheat_verdicts --device cuda --bench public \
  --only kills_its_rivals rewrites_a_library slows_its_rivals rewrites_the_judge 2>&1 | tee "$out/cheats.txt"

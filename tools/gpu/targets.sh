#!/usr/bin/env bash
# Programs against the targets on one GPU (one device command may run 10 minutes).
# $RECIPES: recipe files to build and measure (default: mutations/recipes/fastest.txt);
# each program is named after its recipe file. $ENGINES: engine files measured as well (a search's winner).
#   bash tools/gpu/targets.sh check OUT            # fitness check (derived configs) of each
#   bash tools/gpu/targets.sh compare OUT [ROUNDS] # each, and the seed, benched on the public
#                                                 # cases in fresh processes, interleaved
#   bash tools/gpu/targets.sh targets OUT [CONFIG:CASES..]  # default: the 12-layer config's
#                          # hidden cases and the 1B-class config's large cases, with roofline
#                          # ($SEED=1: the seed too, $BASELINE=1: the recompute baseline;
#                          # CONFIG "public": the repository's own)
#   bash tools/gpu/targets.sh profile OUT [CONFIG:CASES..]  # where each case's time goes, with
#                          # the 10 costliest kernels (CONFIG "public": the repository's own)
#   bash tools/gpu/targets.sh memory OUT [CONFIG:CASES..]  # what is alive at each case's peak
#                          # memory, by phase and engine line (default: one_b:large)
#   bash tools/gpu/targets.sh gate OUT ["CONFIGS"] ["SEEDS"]  # the worst error of each, and the
#                          # seed's, on the target weights of configs the search never saw
#                          # (default: one_b; token seeds 11 12), in tolerances, never cut off
set -uo pipefail
mode=$1 out=$2; mkdir -p "$out"
source tools/gpu/env.sh
RECIPES=${RECIPES:-mutations/recipes/fastest.txt}
engines="${ENGINES:-}"
for recipe in $RECIPES; do
  name=$(basename "$recipe" .txt)
  python3 -m mutations recipe "$recipe" -o "/tmp/$name.py" > /dev/null || exit 1
  engines="$engines /tmp/$name.py"
done
config_dir() {  # the directory of config $1's model_config.json and weights, made if need be
  if [ "$1" = public ]; then echo target; return; fi
  python3 -m target.targets /tmp/configs --only "$1" > /dev/null && echo "/tmp/configs/$1"
}
case $mode in
check)
  for engine in $engines; do
    python3 -m fitness check --engine "$engine" $T | head -12 | tee -a "$out/check.txt"
  done ;;
compare)
  for round in $(seq 1 "${3:-3}"); do
    for engine in $engines seed_engine/engine.py; do
      python3 -m fitness bench --engine "$engine" $T --cases public --roofline | python3 -m tools.bench_line "$round $engine"
    done
  done | tee "$out/compare.txt" ;;
targets)
  for target in ${3:-twelve_layer:hidden one_b:large}; do
    config=${target%%:*} cases=${target##*:}
    dir=$(config_dir "$config") || exit 1
    for engine in $engines ${SEED:+seed_engine/engine.py} ${BASELINE:+fitness/baselines/recompute_engine.py}; do
      python3 -m fitness bench --engine "$engine" --model-config $dir/model_config.json \
        --weight-dir $dir/weights --device cuda --cases "$cases" --roofline \
        | tee "$out/${config}_$(basename "$engine" .py).json" | python3 -m tools.bench_line "$config $engine"
    done
  done | tee "$out/targets.txt" ;;
profile)
  for target in ${3:-public:public one_b:large}; do
    config=${target%%:*} cases=${target##*:}
    dir=$(config_dir "$config") || exit 1
    for engine in $engines; do
      python3 -m tools.profile_case --engine "$engine" --model-config $dir/model_config.json \
        --weight-dir $dir/weights --cases "$cases" --top 10
    done
  done | tee "$out/profile.txt" ;;
memory)
  for target in ${3:-one_b:large}; do
    config=${target%%:*} cases=${target##*:}
    dir=$(config_dir "$config") || exit 1
    for engine in $engines; do
      python3 -m tools.memory_peak --engine "$engine" --model-config $dir/model_config.json \
        --weight-dir $dir/weights --cases "$cases"
    done
  done | tee "$out/memory.txt" ;;
gate)
  for config in ${3:-one_b}; do
    dir=$(config_dir "$config") || exit 1
    for seed in ${4:-11 12}; do
      for engine in seed_engine/engine.py $engines; do
        python3 -m fitness check --engine "$engine" --model-config $dir/model_config.json \
          --weight-dir $dir/weights --device cuda --no-derived --margin 100 --seed "$seed" \
          | python3 -c "import json, sys; v = json.load(sys.stdin); print('$config $seed $engine', v['status'],
              v.get('worst_case', ''), {k: round(x, 3) for k, x in v.get('configs', {}).items()} or v.get('errors'))"
      done
    done
  done | tee "$out/gate.txt" ;;
esac

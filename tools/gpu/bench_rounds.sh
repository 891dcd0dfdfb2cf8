# Sourced by the GPU scripts: two engines benched in turn, in fresh processes, the order
# swapped every round (the first of a pair runs on a cooler or a warmer machine), each
# result saved as DIR/ROUND.NAME.json and printed as one line (tools/bench_line.py). ROUNDS
# rounds, then more while a case's ratio is undecided (tools/versus_recipe.py --decided),
# up to BENCH_MAX_ROUNDS (default: ROUNDS, no more).
#   bench_rounds DIR ROUNDS LABEL NAME_A FILE_A NAME_B FILE_B BENCH_FLAGS...
# then `python -m tools.versus_recipe DIR --engine NAME_A --baseline NAME_B` for the ratios.
bench_rounds() {
  local dir=$1 rounds=$2 label=$3 name_a=$4 file_a=$5 name_b=$6 file_b=$7 round=0 name file
  local most=$(( ${BENCH_MAX_ROUNDS:-0} > $2 ? ${BENCH_MAX_ROUNDS:-0} : $2 ))
  shift 7
  mkdir -p "$dir"
  while (( round < most )); do
    if (( round >= rounds )) && python3 -m tools.versus_recipe "$dir" --engine "$name_a" --baseline "$name_b" \
        --decided > /dev/null 2>&1; then
      break
    fi
    round=$(( round + 1 ))
    for name in $( (( round % 2 )) && echo "$name_a $name_b" || echo "$name_b $name_a"); do
      file=$file_a; [ "$name" = "$name_b" ] && file=$file_b
      python3 -m fitness bench --engine "$file" "$@" > "$dir/$round.$name.json" || echo "round $round: $name failed"
      python3 -m tools.bench_line "${label:+$label }$round $name" < "$dir/$round.$name.json"
    done
  done
}

# The folder (model_config.json, weights/) and the case set a target of target.targets is
# benched on, in $target_dir and $target_cases: "public" is the toy model on every case.
#   target_of TARGET
target_of() {
  target_dir=target target_cases=all
  [ "$1" = public ] && return 0
  local config
  config=$(python3 -m target.targets targets --only "$1") || return 1
  target_dir=$(dirname "$config")
  if python3 -m target.targets --run-flags "$1" | grep -qx long; then target_cases=long; fi
}

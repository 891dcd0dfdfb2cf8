#!/usr/bin/env bash
# The main job: set up, find the target, evolve, leave workspace/engine.py and results.log.
#
#   bash run.sh [--model DIR | --target NAME] [--budget 10m] [any other `python -m evolve run` flag ...]
#
# --model DIR: a Hugging Face model directory (config.json and safetensors, one file or
# sharded; Llama, Qwen2 or Qwen3) instead of the contract's model_config.json and weights.
# --target NAME: one of the repository's other targets (target/targets.py: twelve_layer,
# one_b, bf16, long_prompts), its config and toy weights made under targets/NAME when missing.
#
# The budget covers the run from its Python process's start: the search and the final
# re-measure. Left out, it is the device's default (evolve/config.py: 20m on a GPU, which
# keeps all of run.sh under 30 minutes on one H100; 9m on a CPU, which keeps it under 10
# minutes on 2 cores). Environment, each optional:
#   EVOLVE_BUDGET        the budget when --budget is not given
#   EVOLVE_MODEL_CONFIG  the model config (default /target/model_config.json when it
#   EVOLVE_WEIGHT_DIR    exists, else target/model_config.json; weights alike)
#   EVOLVE_WORKSPACE, EVOLVE_HISTORY, EVOLVE_RUNS_DIR   where the outputs go
set -uo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"

log() { echo "run.sh: $*" >&2; }

# 1. What is missing gets installed; an existing torch (CPU or CUDA) is never replaced.
# Found, not imported: one process, not one import of torch each (seconds of the budget's run).
mapfile -t missing < <("$PYTHON" -c 'import importlib.util, sys
for name in sys.argv[1:]: importlib.util.find_spec(name) or print(name)' \
    torch deap libcst numpy pandas matplotlib safetensors)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    "$PYTHON" -m pip install -q "${missing[@]}" || { log "could not install ${missing[*]}"; exit 1; }
fi

# 2. The target: --model's directory, else --target's, else the evaluator's when it is
# there, else the repository's toy model.
model_dir="" target_name="" passed=()
while (($#)); do
    case "$1" in
        --model) [[ $# -ge 2 ]] || { log "--model needs a directory"; exit 2; }
                 model_dir="$2"; shift 2 ;;
        --model=*) model_dir="${1#--model=}"; shift ;;
        --target) [[ $# -ge 2 ]] || { log "--target needs a name"; exit 2; }
                  target_name="$2"; shift 2 ;;
        *) passed+=("$1"); shift ;;
    esac
done
if [[ -f /target/model_config.json ]]; then
    default_config=/target/model_config.json default_weights=/target/weights
else
    default_config=target/model_config.json default_weights=target/weights
fi
config="${EVOLVE_MODEL_CONFIG:-$default_config}"
weights="${EVOLVE_WEIGHT_DIR:-$default_weights}"
if [[ -n "$model_dir" ]]; then  # the flag beats the environment, as --budget does
    config="$model_dir/config.json" weights="$model_dir"
fi
if [[ "$weights" == target/weights && ! -f "$weights/model.pt" ]]; then
    log "generating the toy weights in $weights"
    "$PYTHON" -m target.toy_weights --config "$config" --output "$weights/model.pt" || exit 1
fi

[[ -n "$model_dir" && -n "$target_name" ]] && { log "--model and --target name two targets: give one"; exit 2; }
target_flags=()  # its config, weights and the flags it needs, after the defaults: they win
if [[ -n "$target_name" ]]; then
    mapfile -t target_flags < <("$PYTHON" -m target.targets --run-flags "$target_name")
    ((${#target_flags[@]})) || { log "could not make target $target_name"; exit 2; }
fi

# 3. The search.
workspace="${EVOLVE_WORKSPACE:-workspace}"
args=(--model-config "$config" --weight-dir "$weights" "${target_flags[@]}" --workspace "$workspace"
      --history "${EVOLVE_HISTORY:-history.csv}" --runs-dir "${EVOLVE_RUNS_DIR:-runs}")
[[ -n "${EVOLVE_BUDGET:-}" ]] && args+=(--budget "$EVOLVE_BUDGET")
log "python -m evolve run ${args[*]} ${passed[*]}"
"$PYTHON" -m evolve run "${args[@]}" "${passed[@]}"
status=$?

# 4. Whatever happened, the outputs exist: the seed stands in when nothing better was kept.
mkdir -p "$workspace"
if [[ ! -f "$workspace/engine.py" ]]; then
    cp seed_engine/engine.py "$workspace/engine.py"
    echo "run.sh: the search left no engine (exit $status); workspace/engine.py is the seed" >> "$workspace/results.log"
fi
[[ -f "$workspace/results.log" ]] || echo "run.sh: the search exited $status and wrote no log" > "$workspace/results.log"
exit $status

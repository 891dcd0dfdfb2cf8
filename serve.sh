#!/usr/bin/env bash
# Serve an engine behind the OpenAI API; prints the URL once it answers, serves until stopped.
#
#   bash serve.sh [--engine FILE] [--model DIR | --model-config C --weight-dir W] [--host H]
#                 [--port 8000] [any other `python -m serve` flag ...]
#
# --model DIR: a Hugging Face model directory (config.json, safetensors, and its tokenizer when
# it has one), as run.sh --model takes it. On CUDA one replica of the engine serves on each GPU
# (--replicas N for fewer).
# The engine defaults to workspace/engine.py (what run.sh leaves), else the seed; the model
# to the target run.sh uses: /target/model_config.json and /target/weights when they exist,
# else the repository's toy model, whose weights (and tokenizer) are generated when missing.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"

engine=workspace/engine.py
[[ -f "$engine" ]] || engine=seed_engine/engine.py
if [[ -f /target/model_config.json ]]; then
    config=/target/model_config.json weights=/target/weights
else
    config=target/model_config.json weights=target/weights
fi
host=127.0.0.1 port=8000
rest=()
while (($#)); do
    case "$1" in
        --engine) engine="$2"; shift 2 ;;
        --model) [[ $# -ge 2 && -f "$2/config.json" ]] || { echo "serve.sh: --model needs a directory with a config.json" >&2; exit 2; }
                 config="$2/config.json" weights="$2"; shift 2 ;;
        --model-config) config="$2"; shift 2 ;;
        --weight-dir) weights="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        *) rest+=("$1"); shift ;;
    esac
done

if [[ "$weights" == target/weights && ! -f "$weights/model.pt" ]]; then
    echo "serve.sh: generating the toy weights in $weights" >&2
    "$PYTHON" -m target.toy_weights --config "$config" --output "$weights/model.pt"
fi
echo "serve.sh: $engine on $config" >&2
exec "$PYTHON" -m serve --engine "$engine" --model-config "$config" --weight-dir "$weights" \
    --host "$host" --port "$port" ${rest[@]+"${rest[@]}"}

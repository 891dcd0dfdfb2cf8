# Sourced by the GPU scripts, from the repository root on the device machine: unbuffered
# output, the carried wheels (deap, libcst: README of the device tool), the GPU's name, the
# toy weights, and $T, the target arguments every fitness command takes. The wheels and the
# weights are put in place once: a second script on the same host (one search per GPU) must
# not replace files under a running one.
export PYTHONUNBUFFERED=1
if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "env.sh: no wheels in .whl/: name .whl in the run's carry (deap and libcst are needed; ../shared/tools/gpu-wheels.sh)" >&2
elif [ ! -f /tmp/site/.carried ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.carried
fi
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -f target/weights/model.pt ] || python3 -m target.toy_weights > /dev/null
T="--model-config target/model_config.json --weight-dir target/weights --device cuda"

# An engine's batch-1 and 64 x 256 decode steps on a Hugging Face directory, beside the bound
# (fitness bench --step-time --roofline): the JSON to FILE, its errors beside it in bench.err,
# one line printed. Extra arguments go to fitness bench (--warmup 1 --repeat 1); a --case
# among them takes the place of the two.
#   decode_steps LABEL ENGINE DIR FILE [flags ...]
decode_steps() {
    local label=$1 engine=$2 dir=$3 file=$4; shift 4
    local cases=(--case decode_1x128x64 --case decode_64x256x64)
    [[ " $* " == *" --case "* ]] && cases=()
    python3 -m fitness bench --engine "$engine" --model-config "$dir/config.json" --weight-dir "$dir" \
        --device cuda --cases large ${cases[@]+"${cases[@]}"} --step-time --roofline "$@" \
        > "$file" 2>> "$(dirname "$file")/bench.err"
    python3 -m tools.bench_line "$label" < "$file"
}

# `python -m serve` on a free port, its output in DIR/server.out and server.log: sets $server
# (its pid; killed on exit) and $url; returns 1, the log's tail printed, if it died or did not
# start in 400 s (a 65 GB model loads in about a minute). Extra arguments go to the server.
#   start_server DIR [serve flags ...]
start_server() {
    local dir=$1; shift
    python3 -m serve "$@" --port 0 > "$dir/server.out" 2> "$dir/server.log" &
    server=$!
    trap 'kill $server 2>/dev/null' EXIT
    url=
    for _ in $(seq 400); do
        url=$(awk '/^serving /{print $2}' "$dir/server.out")
        [[ -n "$url" ]] && return 0
        kill -0 $server 2>/dev/null || { echo "the server died:"; tail -20 "$dir/server.log"; return 1; }
        sleep 1
    done
    echo "the server did not start in 400 s"; return 1
}

# /mnt/ram, a tmpfs of at least SIZE GiB: mounted, or grown in place where a script before
# on this host mounted a smaller one (full_checkpoint's overflow 40, moe_full48.sh's 64).
#   ram_folder SIZE
ram_folder() {
    local size=$1
    mkdir -p /mnt/ram
    if ! mountpoint -q /mnt/ram; then
        mount -t tmpfs -o size="${size}g" tmpfs /mnt/ram
    elif (( $(df --output=size -BG /mnt/ram | tail -1 | tr -dc 0-9) < size )); then
        mount -o remount,size="${size}g" /mnt/ram
    fi
}

# target.hf_checkpoints' NAME drawn on the GPU into ROOT/NAME, with a byte-level tokenizer of
# its vocabulary; a shard that would leave the disk under 2 GiB goes to a tmpfs (the one-GPU
# kinds' 64 GiB of disk hold neither the 57 nor the 65 GiB shape). Errors to ERRORS.
#   full_checkpoint ROOT NAME ERRORS
full_checkpoint() {
    local root=$1 name=$2 errors=$3
    ram_folder 40
    python3 -m target.hf_checkpoints "$root" --device cuda --only "$name" --overflow /mnt/ram > /dev/null 2> "$errors" || return 1
    python3 -m target.toy_tokenizer --config "$root/$name/config.json" --output "$root/$name" > /dev/null 2>> "$errors"
}

# RECIPE's program with one knob set (NAME=VALUE, a tune_constant line after the recipe's) at
# OUT.py, its recipe beside it (OUT.txt).
#   knob_program RECIPE NAME=VALUE OUT.py
knob_program() {
    local recipe=$1 knob=$2 program=$3
    { cat "$recipe"; echo "tune_constant {\"constant\": \"${knob%=*}\", \"new\": ${knob#*=}}"; } > "${program%.py}.txt"
    python3 -m mutations recipe "${program%.py}.txt" -o "$program" > /dev/null
}

# A serve.bench report's levels beside the most the model allows on this GPU
# (tools.served_vs_bound; nothing on a GPU fitness.roofline does not know).
#   beside_bound OUT_DIR MODEL_DIR     (OUT_DIR/bench.json, MODEL_DIR/config.json)
beside_bound() {
    python3 -m tools.served_vs_bound "$1/bench.json" --model-config "$2/config.json" --gpu auto
}

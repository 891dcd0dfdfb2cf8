#!/usr/bin/env bash
# Replicas against one GPU on the same host (issues 62-63): the server with --replicas N for
# each N of $COUNTS (default "1 2 1 2": interleaved, twice), one serve.bench level each, the
# output tokens/s of each printed, then each count's median over the first:
#   bash tools/gpu/replicas.sh OUT      # on nvidia-h200-x2 (COUNTS="1 4 1 4" on a 4-GPU kind)
# $ENGINE serves another file (default: fastest.txt's program); $CONFIG another of
# target.targets (default one_b), or $MODEL_DIR a Hugging Face directory; $BENCH_FLAGS go to
# serve.bench (default: concurrency 128, 128 requests of 1,024 in and 1,024 out, no burst).
# Carry the server's wheels in .whl (tools/gpu/serve.sh says which).
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
nvidia-smi -L
engine=${ENGINE:-/tmp/fastest.py}
[[ -n "${ENGINE:-}" ]] || python3 -m mutations recipe mutations/recipes/fastest.txt -o "$engine" > /dev/null 2>&1 || exit 1
if [[ -n "${MODEL_DIR:-}" ]]; then
    config=$MODEL_DIR/config.json; weights=$MODEL_DIR
else
    config=$(python3 -m target.targets /tmp/targets --only "${CONFIG:-one_b}") || exit 1; weights=$(dirname "$config")/weights
fi
i=0
for n in ${COUNTS:-1 2 1 2}; do
    i=$((i + 1)); dir=$out/$i.replicas_$n; mkdir -p "$dir"
    started=$SECONDS
    start_server "$dir" --engine "$engine" --model-config "$config" --weight-dir "$weights" --replicas "$n" || exit 1
    echo "replicas $n up after $((SECONDS - started)) s"
    python3 -m serve.bench --base-url "$url" --model-config "$config" --out "$dir" \
        ${BENCH_FLAGS:---concurrency 128 --num-requests 128 --input-len 1024 --output-len 1024 --burst 0} > /dev/null
    kill "$server"; wait "$server" 2> /dev/null
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
runs = {}
for path in sorted(Path(sys.argv[1]).glob("*.replicas_*/bench.json")):
    n = int(path.parent.name.split("_")[-1])
    for level in json.loads(path.read_text())["sweep"]:
        print(f"replicas {n}: concurrency {level['concurrency']}, {level['completed']} of {level['requests']}, "
              f"{level['output_tokens_per_s']:,.0f} output tok/s, TTFT p50 {level['ttft_ms']['p50']} ms, "
              f"TPOT p50 {level['tpot_ms']['p50']} ms")
        runs.setdefault(n, []).append(level["output_tokens_per_s"])
one = statistics.median(runs[min(runs)])
for n, figures in sorted(runs.items()):
    print(f"replicas {n}: median {statistics.median(figures):,.0f} tok/s, {statistics.median(figures) / one:.3f}x replicas {min(runs)}")
PY

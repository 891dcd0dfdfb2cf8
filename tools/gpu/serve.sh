#!/usr/bin/env bash
# The server on one GPU: the recipe's program (fastest.txt) served on the 1B-class config and
# measured by serve.bench, beside the same engine offline (tools.serve_offline), in one call:
#   bash tools/gpu/serve.sh OUT       # offline; concurrency 1 and 64, 300 at once; the ratios;
#                                     # then the per-step timeline at 64 and 300 (tools.serve_timeline)
#                                     # and 40 requests one by one, their TTFT taken apart
#   LEVELS=1,2,4,8,16,32,64 TIMELINE=0 bash tools/gpu/serve.sh OUT   # the whole sweep instead
# One device command may run 10 minutes (the default takes about five). It also checks greedy
# outputs against the reference (tools.serve_greedy_check; CHECK=0: not).
# $ENGINE serves another file; $CONFIG another of target.targets (default one_b);
# $BENCH_FLAGS go to serve.bench (e.g. "--num-requests 16"), $TIMELINE_FLAGS to tools.serve_timeline,
# $SERVER_FLAGS to the server: with "--timeline" there, serve.bench's levels are printed step by
# step too (tools.serve_timeline --recorded: each level's ramp and steps).
# The GPU image lacks the server's libraries: carry them in .whl (device README) beside deap
# and libcst, as tested here: fastapi 0.165.0, starlette 1.10.0, uvicorn 0.54.0,
# httptools 0.9.0, pydantic 2.13.4, pydantic-core 2.46.4, annotated-types 0.7.0,
# typing-inspection 0.4.2, opentelemetry-api 1.45.2, annotated-doc 0.0.7 (the image's Python
# is 3.12: pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl ...);
# aiohttp, httpx, anyio, h11, click, jinja2 and tokenizers are there.
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
engine=${ENGINE:-/tmp/fastest.py}
[[ -n "${ENGINE:-}" ]] || python3 -m mutations recipe mutations/recipes/fastest.txt -o "$engine" > /dev/null || exit 1
config=$(python3 -m target.targets /tmp/targets --only "${CONFIG:-one_b}") || exit 1
target=(--model-config "$config" --weight-dir "$(dirname "$config")/weights")

if [[ "${OFFLINE:-1}" == 1 ]]; then
    python3 -m tools.serve_offline --engine "$engine" "${target[@]}" | tee "$out/offline.json"
fi

started=$SECONDS
start_server "$out" --engine "$engine" "${target[@]}" ${SERVER_FLAGS:-} || exit 1
echo "serving $url (up after $((SECONDS - started)) s)"
if [[ "${CHECK:-1}" == 1 ]]; then  # greedy outputs against the reference's, 32 at once
    python3 -m tools.serve_greedy_check --base-url "$url" "${target[@]}" | tee "$out/greedy_check.json"
fi
python3 -m serve.bench --base-url "$url" --model-config "$config" --out "$out" \
    --concurrency "${LEVELS:-1,64}" --burst "${BURST:-300}" ${BENCH_FLAGS:-}
[[ -f "$out/offline.json" ]] && python3 -m tools.served_vs_offline "$out" | tee "$out/served_vs_offline.json"
if [[ " ${SERVER_FLAGS:-} " == *" --timeline "* ]]; then
    python3 -m tools.serve_timeline --base-url "$url" --recorded --rows 6 | tee "$out/bench_timeline.txt"
fi
kill $server; wait $server 2>/dev/null  # its GPU memory, for the timeline's own server
if [[ "${TIMELINE:-1}" == 1 ]]; then  # where each step's time goes, in the core and the API process
    SERVE_LOG="$out/timeline_server.log" python3 -m tools.serve_timeline --engine "$engine" "${target[@]}" \
        --device cuda --concurrency 64 300 ${TIMELINE_FLAGS:---input-len 1024 --output-len 1024 --one-by-one 40} \
        | tee "$out/timeline.txt"
fi

#!/usr/bin/env bash
# Issue 63 on a 4-GPU host (235 GiB of disk holds the 64.6 GiB checkpoint): the hybrid's
# recipe (mutations/recipes/qwen3_5_by_hand.txt) on Qwen3.5-35B-A3B's shape, served with a
# replica on every GPU, then with one, on the same host:
#   bash tools/gpu/hybrid_replicas.sh OUT     (longer than one call: under setsid; poll it
#                                              with tools/gpu/follow.sh at once)
# 1. the full checkpoint drawn on GPU 0; beside it, on GPU 1 and not past $SIDE_S seconds
#    (default 420), issue 62's smaller checks: FULL=0 tools/gpu/hybrid_programs.sh OUT/programs
#    with $GATE and $BENCH (default: the shared expert's kernels against `all`);
# 2. every GPU's replica: the hackathon's sweep (serve.bench --workload hackathon, levels 1-64,
#    64 requests a level) and then 300 requests at once; then $PER_GPU (default 64) requests a
#    GPU at once, twice;
# 3. one replica: the same load on one GPU ($PER_GPU at once, twice), and the sweep's levels
#    16-64. The scaling is 2.'s last level over 3.'s, the load per GPU alike. With $ALSO (an
#    allele, e.g. plus_shared_expert.triton), the recipe plus it on one replica next, the same
#    load three times.
# SIDE_S=0 leaves 1.'s checks out.
# OUT/done appears at the end (follow.sh OUT SECONDS done).
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }
gpus=$(nvidia-smi -L | wc -l) per_gpu=${PER_GPU:-64}
df -h / /tmp 2>&1 | tee "$out/disks.txt"; free -g | tee -a "$out/disks.txt"

stage program and checkpoint
program=/tmp/hybrid_all.py full=/tmp/hf_full/qwen3_5_35b_a3b
python3 -m mutations recipe mutations/recipes/qwen3_5_by_hand.txt -o $program > /dev/null || { touch "$out/done"; exit 1; }
[[ -n "${ALSO:-}" ]] && { python3 -m mutations apply "allele.$ALSO" $program -o /tmp/hybrid_also.py > /dev/null || exit 1; }
side_end=$((SECONDS + ${SIDE_S:-420})) side=
if (( ${SIDE_S:-420} > 0 )); then
  CUDA_VISIBLE_DEVICES=1 GATE=${GATE:-shared} BENCH=${BENCH:-all shared all shared} FULL=0 \
    setsid bash tools/gpu/hybrid_programs.sh "$out/programs" > "$out/programs.log" 2>&1 &
  side=$!  # its own process group, ended whole at its deadline
fi
CUDA_VISIBLE_DEVICES=0 python3 -m target.hf_checkpoints /tmp/hf_full --device cuda --only qwen3_5_35b_a3b \
  > /dev/null 2> "$out/full_write.err" || { touch "$out/done"; exit 1; }
python3 -m target.toy_tokenizer --config "$full/config.json" --output "$full" > /dev/null 2>> "$out/full_write.err"
du -sh "$full" | tee -a "$out/disks.txt"
if [[ -n $side ]]; then
  stage "waiting for issue 62's checks"
  while kill -0 $side 2> /dev/null && (( SECONDS < side_end )); do sleep 2; done
  kill -- -$side 2> /dev/null && echo "issue 62's checks stopped at their deadline" | tee -a "$out/stages.txt"
fi

up() {  # REPLICAS DIR [ENGINE]: the server up ($server, $url)
  local started=$SECONDS; mkdir -p "$2"
  start_server "$2" --engine "${3:-$program}" --model-config "$full/config.json" --weight-dir "$full" --replicas "$1" || return 1
  echo "replicas $1 up after $((SECONDS - started)) s" | tee -a "$out/stages.txt"
}
load() {  # DIR BENCH_FLAGS...: one serve.bench run on the hackathon's lengths
  local dir=$1; shift; mkdir -p "$dir"
  python3 -m serve.bench --base-url "$url" --tokenizer "$full" --out "$dir" --workload hackathon "$@" | tee "$dir/bench.txt"
}

stage "$gpus replicas"
if up "$gpus" "$out/replicas_$gpus"; then
  load "$out/replicas_$gpus/sweep" --burst 300
  load "$out/replicas_$gpus/saturated" --concurrency $((gpus * per_gpu)),$((gpus * per_gpu)) --num-requests $((gpus * per_gpu))
  kill $server; wait $server 2> /dev/null
fi
stage one replica
if up 1 "$out/replicas_1"; then
  load "$out/replicas_1/saturated" --concurrency "$per_gpu,$per_gpu,16,32,64"
  kill $server; wait $server 2> /dev/null
fi
if [[ -n "${ALSO:-}" ]] && up 1 "$out/replicas_1_$ALSO" /tmp/hybrid_also.py; then
  load "$out/replicas_1_$ALSO/saturated" --concurrency "$per_gpu,$per_gpu,$per_gpu"
  kill $server; wait $server 2> /dev/null
fi
stage done
touch "$out/done"

#!/usr/bin/env bash
# The hybrid's recipe (mutations/recipes/qwen3_5_by_hand.txt) on Qwen3.5-35B-A3B's shape (random
# bf16, 64.6 GiB), served on one host with a replica on every GPU, then with one (issues 62-63;
# docs/log/2026-11-29-hybrid-replicas-four-and-two-gpus.md):
#   bash tools/gpu/hybrid_replicas.sh OUT     (longer than one call: under setsid; poll it
#                                              with tools/gpu/follow.sh at once)
# 1. the full checkpoint drawn on the first GPU; beside it, on the second and not past $SIDE_S seconds
#    (default 420; none on one GPU), issue 62's smaller checks: FULL=0 tools/gpu/hybrid_programs.sh OUT/programs
#    with $GATE and $BENCH (default: the shared expert's kernels against `all`);
# 2. every GPU's replica: the hackathon's sweep (serve.bench --workload hackathon, levels 1-64,
#    64 requests a level) and then 300 requests at once; then $PER_GPU (default 64) requests a
#    GPU at once, twice;
# 3. one replica: the same load on one GPU, $ONE_LEVELS (default: $PER_GPU at once, twice,
#    then the sweep's levels 16-64). The scaling is 2.'s last level over 3.'s first two, the
#    load per GPU alike. With $ALSO (an allele, plus_shared_expert.triton, or a knob set,
#    SYSTEM_ROWS_FROM_MEMORY=1), the recipe with it on one replica next, $ALSO_LEVELS (default:
#    $PER_GPU at once three times); $ROUNDS (default 1) rounds of the two in turn; $ONE_FLAGS
#    go to each of their serve.bench runs (--num-requests 16: shorter low levels).
# SIDE_S=0 leaves 1.'s checks out; on one GPU (or REPLICAS=0) 2. is left out. On a small disk
# (the one-GPU kinds') the checkpoint's overflow goes to a tmpfs (env.sh's full_checkpoint).
# OUT/done appears at the end (follow.sh OUT SECONDS done).
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }
# The GPUs given (CUDA_VISIBLE_DEVICES: GPU 1 of two, beside a search on GPU 0), else every one.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
else mapfile -t visible < <(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 ))); fi
gpus=${#visible[@]} per_gpu=${PER_GPU:-64}
df -h / /tmp 2>&1 | tee "$out/disks.txt"; free -g | tee -a "$out/disks.txt"

stage program and checkpoint
program=/tmp/hybrid_all.py full=/tmp/hf_full/qwen3_5_35b_a3b
python3 -m mutations recipe mutations/recipes/qwen3_5_by_hand.txt -o $program > /dev/null || { touch "$out/done"; exit 1; }
if [[ "${ALSO:-}" == *=* ]]; then
  knob_program mutations/recipes/qwen3_5_by_hand.txt "$ALSO" /tmp/hybrid_also.py || exit 1
elif [[ -n "${ALSO:-}" ]]; then
  python3 -m mutations apply "allele.$ALSO" $program -o /tmp/hybrid_also.py > /dev/null || exit 1
fi
side_s=${SIDE_S:-$(( gpus > 1 ? 420 : 0 ))}  # the checks need a GPU of their own
side_end=$((SECONDS + side_s)) side=
if (( side_s > 0 && gpus > 1 )); then
  CUDA_VISIBLE_DEVICES=${visible[1]} GATE=${GATE:-shared} BENCH=${BENCH:-all shared all shared} FULL=0 \
    setsid bash tools/gpu/hybrid_programs.sh "$out/programs" > "$out/programs.log" 2>&1 &
  side=$!  # its own process group, ended whole at its deadline
fi
CUDA_VISIBLE_DEVICES=${visible[0]} full_checkpoint /tmp/hf_full qwen3_5_35b_a3b "$out/full_write.err" \
  || { touch "$out/done"; exit 1; }
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
  beside_bound "$dir" "$full" | tee -a "$dir/bench.txt"
}

if (( gpus > 1 )) && [[ "${REPLICAS:-1}" != 0 ]]; then
  stage "$gpus replicas"
  if up "$gpus" "$out/replicas_$gpus"; then
    load "$out/replicas_$gpus/sweep" --burst 300
    load "$out/replicas_$gpus/saturated" --concurrency $((gpus * per_gpu)),$((gpus * per_gpu)) --num-requests $((gpus * per_gpu))
    kill $server; wait $server 2> /dev/null
  fi
fi
stage one replica
for round in $(seq "${ROUNDS:-1}"); do
  if up 1 "$out/replicas_1/$round/recipe"; then
    load "$out/replicas_1/$round/recipe" --concurrency "${ONE_LEVELS:-$per_gpu,$per_gpu,16,32,64}" ${ONE_FLAGS:-}
    kill $server; wait $server 2> /dev/null
  fi
  if [[ -n "${ALSO:-}" ]] && up 1 "$out/replicas_1/$round/${ALSO%=*}" /tmp/hybrid_also.py; then
    load "$out/replicas_1/$round/${ALSO%=*}" --concurrency "${ALSO_LEVELS:-$per_gpu,$per_gpu,$per_gpu}" ${ONE_FLAGS:-}
    kill $server; wait $server 2> /dev/null
  fi
done
stage done
touch "$out/done"

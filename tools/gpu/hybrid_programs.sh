#!/usr/bin/env bash
# Issue 62 on one H200 (64 GiB of disk: the 64.6 GiB checkpoint spills into a tmpfs), the
# hybrid's programs from the seed, each a swap more than the last:
#   moe     = the seed + moe.triton_grouped + route.triton_topk (issue 61's kernels)
#   fused   = moe + RecurrentState.slots + delta_net_decode.triton_fused
#   graphs  = fused + Engine.cuda_graphs + attend_decode.triton_split_kv
#   prefill = graphs + delta_net_prefill.triton_chunked
#   gates   = prefill + delta_gates.triton + gated_rms_norm.triton
#   systems = gates + chunk_systems.triton + prompt_convs.triton (the prefill's chunk systems
#             and causal convs, each one launch)
#   all     = mutations/recipes/qwen3_5_by_hand.txt: systems + the generic alleles and rewrites
#             of fastest.txt (dense models' norms, RoPE, projections, head) but its prefill
#             graphs, which keep no DeltaNet state, and the MoE knobs tuned for Qwen3.5
#   shared  = all + plus_shared_expert.triton (the shared expert in two kernels)
#   rows    = all with SYSTEM_ROWS_FROM_MEMORY = 1 (chunk_systems.triton's substitution loads
#             A's rows from a scratch instead of reducing them out of registers)
#   bash tools/gpu/hybrid_programs.sh OUT        (longer than one call: under setsid)
# Poll it at once, each call writing one tarball of OUT to $OUT: a call that brings back many
# files returns late, and the machine (with the run) is given back 30 s after a call ends.
# 1. the kernels' GPU tests; the gate on the tiny hybrid (bf16, every derived config) of
#    $GATE (default: all shared);
# 2. 4 layers of the real width: batch-1 and 64 x 256 decode steps of $BENCH (default:
#    all shared all shared) beside the bound, and where the served program's 64 x 256 case and a packed
#    prefill of 16 x 1,024 spend their time (tools.profile_case; $PROFILED names the programs
#    profiled, default the served one). The served program is
#    $SERVED, else the first of all, systems whose gate passed, else graphs;
# 3. all 40 layers: the served program's steps (fitness bench --one-engine), then served
#    on the hackathon's workload (serve.bench --workload hackathon; LEVELS overrides its levels).
#    FULL=0 stops before it (the full shape drawn elsewhere: tools/gpu/hybrid_replicas.sh).
# Each stage appends to OUT/stages.txt; a stage that fails is noted and the next one runs.
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }
df -h / /tmp /dev/shm 2>&1 | tee "$out/disks.txt"; free -g | tee -a "$out/disks.txt"

stage programs
p=/tmp/programs; mkdir -p $p
python3 -m mutations apply allele.moe.triton_grouped seed_engine/engine.py -o $p/a.py > /dev/null &&
python3 -m mutations apply allele.route.triton_topk $p/a.py -o $p/moe.py > /dev/null &&
python3 -m mutations apply allele.RecurrentState.slots $p/moe.py -o $p/b.py > /dev/null &&
python3 -m mutations apply allele.delta_net_decode.triton_fused $p/b.py -o $p/fused.py > /dev/null &&
python3 -m mutations apply allele.Engine.cuda_graphs $p/fused.py -o $p/c.py > /dev/null &&
python3 -m mutations apply allele.attend_decode.triton_split_kv $p/c.py -o $p/graphs.py > /dev/null &&
python3 -m mutations apply allele.delta_net_prefill.triton_chunked $p/graphs.py -o $p/prefill.py > /dev/null &&
python3 -m mutations apply allele.delta_gates.triton $p/prefill.py -o $p/d.py > /dev/null &&
python3 -m mutations apply allele.gated_rms_norm.triton $p/d.py -o $p/gates.py > /dev/null &&
python3 -m mutations apply allele.chunk_systems.triton $p/gates.py -o $p/e.py > /dev/null &&
python3 -m mutations apply allele.prompt_convs.triton $p/e.py -o $p/systems.py > /dev/null || exit 1
python3 -m mutations recipe mutations/recipes/qwen3_5_by_hand.txt -o $p/all.py > /dev/null || exit 1
python3 -m mutations apply allele.plus_shared_expert.triton $p/all.py -o $p/shared.py > /dev/null || exit 1
knob_program mutations/recipes/qwen3_5_by_hand.txt SYSTEM_ROWS_FROM_MEMORY=1 $p/rows.py || exit 1
grep -h "^# allele" $p/all.py | sort | uniq -c | tee "$out/all_alleles.txt"

stage kernels
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "${GPU_TESTS:-delta_net or moe_triton or shared_expert}" 2>&1 | tail -15 > "$out/gpu_tests.txt"
tail -1 "$out/gpu_tests.txt"

stage checkpoints
python3 -m target.hf_checkpoints /tmp/hf --device cuda --only tiny_qwen3_5_moe --only qwen3_5_35b_a3b_4_layers > /dev/null || exit 1
tiny=/tmp/hf/tiny_qwen3_5_moe four=/tmp/hf/qwen3_5_35b_a3b_4_layers full=/tmp/hf/qwen3_5_35b_a3b

stage gate on the tiny hybrid
for name in ${GATE:-all shared}; do
  python3 -m fitness judge $p/$name.py --model-config "$tiny" --weight-dir "$tiny" --device cuda --bench none \
      --vouch --seed 1364846281 > "$out/gate_$name.json" 2> "$out/gate_$name.err"
  python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(sys.argv[2], v['status'], v['stage'], v['worst_ratio'], v['worst_case'], v['error'][:300])" \
      "$out/gate_$name.json" $name | tee -a "$out/gates.txt"
done
served=$p/graphs.py
for name in all systems; do grep -q "^$name ok" "$out/gates.txt" && { served=$p/$name.py; break; }; done
[[ -n "${SERVED:-}" ]] && served=$p/$SERVED.py
echo "served: $served" | tee -a "$out/stages.txt"

stage four layers
i=0
for name in ${BENCH:-all shared all shared}; do  # turn about: the pair on one machine
  i=$((i + 1))
  decode_steps "4 layers $name ($i)" $p/$name.py "$four" "$out/bench_4_layers_${i}_$name.json" --warmup 1 --repeat 2
done
for name in ${PROFILED:-$(basename $served .py)}; do  # each profiled program, its two cases
  for case in decode_64x256x64 prefill_16x1024; do
    python3 -m tools.profile_case --engine $p/$name.py --model-config "$four/config.json" --weight-dir "$four" \
        --cases large --case $case --top ${TOP:-40} > "$out/profile_4_layers_${name}_$case.txt" 2>&1
  done
done

[[ "${FULL:-1}" == 1 ]] || { stage done; exit 0; }
stage full checkpoint
full_checkpoint /tmp/hf qwen3_5_35b_a3b "$out/full_write.err" || exit 1
ls -la "$full" | head -5; df -h /tmp /mnt/ram | tee -a "$out/disks.txt"

stage all 40 layers
[[ "${FULL_BENCH:-1}" == 1 ]] && decode_steps "40 layers $(basename $served .py)" $served "$full" \
    "$out/bench_40_layers.json" --warmup 1 --repeat 1 --one-engine

stage served
if start_server "$out" --engine $served --model-config "$full/config.json" --weight-dir "$full" --replicas 1; then
  python3 -m serve.bench --base-url "$url" --tokenizer "$full" --out "$out" --workload hackathon \
      ${LEVELS:+--concurrency $LEVELS} | tee "$out/served.txt"
  beside_bound "$out" "$full" | tee -a "$out/served.txt"
fi
kill $server 2>/dev/null
stage done

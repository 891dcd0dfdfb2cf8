#!/usr/bin/env bash
# The MoE kernels' knobs (moe.triton_grouped) tuned for a family's sparse layer on one GPU, then
# its hand-composed program (its tune_constant lines left out: `hand`) with the fastest setting
# of each bucket (`tuned`) against itself at the allele's defaults:
#   bash tools/gpu/moe_knobs.sh OUT               (longer than one call: under setsid, polled)
#   FAMILY=qwen3_moe bash tools/gpu/moe_knobs.sh OUT
# FAMILY qwen3_5 (the default; issue 62): Qwen3.5-35B-A3B, 256 experts of 512,
# mutations/recipes/qwen3_5_by_hand.txt; qwen3_moe (issue 61): Qwen3-30B-A3B, 128 experts of
# 768, mutations/recipes/qwen3_moe_by_hand.txt.
# 1. tools.probes.moe_layer_bench at 64 rows (a decode step at concurrency 64: the MANY
#    bucket) and 16,384 (a packed prefill: SORTED); the fastest setting of each as
#    tune_constant lines after the recipe's (OUT/tuned.txt, built as tuned);
# 2. 4 layers of the real width: batch-1 and 64 x 256 decode steps of hand and tuned;
# 3. every layer served on the hackathon's workload at concurrency 64 (LEVELS overrides),
#    tuned then hand, one server each (SERVE=0: not). Both full checkpoints (57 and 65 GiB)
#    pass the one-GPU kinds' 64 GiB of disk with their overflow in a tmpfs.
set -uo pipefail
out=$1; mkdir -p "$out"
source tools/gpu/env.sh
stage() { echo "== $* $(date +%T)" | tee -a "$out/stages.txt"; }
case ${FAMILY:-qwen3_5} in
  qwen3_5) shape=(--experts 256 --inter 512) recipe=mutations/recipes/qwen3_5_by_hand.txt checkpoint=qwen3_5_35b_a3b ;;
  qwen3_moe) shape=(--experts 128 --inter 768) recipe=mutations/recipes/qwen3_moe_by_hand.txt checkpoint=qwen3_30b_a3b ;;
  *) echo "FAMILY must be qwen3_5 or qwen3_moe, not $FAMILY"; exit 2 ;;
esac
p=/tmp/programs; mkdir -p $p

stage programs
grep -v "^tune_constant" $recipe > $p/untuned.txt  # the knobs at the allele's defaults
python3 -m mutations recipe $p/untuned.txt -o $p/hand.py > /dev/null || exit 1

stage sweep
python3 -m tools.probes.moe_layer_bench "${shape[@]}" --rows 64 --top 5 > "$out/moe_64.txt" 2>&1
python3 -m tools.probes.moe_layer_bench "${shape[@]}" --rows 16384 --layers 2 --top 5 \
    > "$out/moe_16384.txt" 2>&1
# The fastest setting of each bucket as the recipe's tune_constant lines (the rewrite checks
# each value against the constant's declared range), for the knobs it moves from the defaults
python3 - "$out/moe_64.txt" "$out/moe_16384.txt" <<'EOF' > $p/knobs.txt
import json, sys
from mutations.alleles import load_module
defaults = load_module("moe", "triton_grouped")
for sweep in sys.argv[1:]:
    lines = [json.loads(line) for line in open(sweep) if line.startswith("{")]
    best = next((r for r in lines if r.get("what", "").startswith("experts, ")), None)
    if best is None:
        print(f"# {sweep}: no setting timed")
        continue
    bucket = best["what"].split()[1]
    print(f"# {bucket}: {best['knobs']}, {best['us_a_layer']} us a layer")
    for knob, value in best["knobs"].items():
        name, old = f"MOE_{bucket}_{knob}", getattr(defaults, f"MOE_{bucket}_{knob}")
        if value != old:
            print("tune_constant " + json.dumps({"constant": name, "new": value, "old": old}))
EOF
cat $p/untuned.txt $p/knobs.txt > "$out/tuned.txt"
grep "^#" $p/knobs.txt
python3 -m mutations recipe "$out/tuned.txt" -o $p/tuned.py > /dev/null || exit 1

stage checkpoints
python3 -m target.hf_checkpoints /tmp/hf --device cuda --only ${checkpoint}_4_layers > /dev/null || exit 1
four=/tmp/hf/${checkpoint}_4_layers full=/tmp/hf/$checkpoint

stage four layers
for name in hand tuned; do
  decode_steps "4 layers $name" $p/$name.py "$four" "$out/bench_4_layers_$name.json" --warmup 1 --repeat 2
done

[[ "${SERVE:-1}" == 1 ]] || { stage done; exit 0; }
stage full checkpoint
full_checkpoint /tmp/hf $checkpoint "$out/full_write.err" || exit 1

for name in tuned hand; do
  stage served $name
  mkdir -p "$out/$name"
  if start_server "$out/$name" --engine $p/$name.py --model-config "$full/config.json" --weight-dir "$full" --replicas 1; then
    python3 -m serve.bench --base-url "$url" --tokenizer "$full" --out "$out/$name" --workload hackathon \
        --concurrency ${LEVELS:-64} | tee "$out/served_$name.txt"
    beside_bound "$out/$name" "$full" | tee -a "$out/served_$name.txt"
  fi
  kill $server 2>/dev/null; wait $server 2>/dev/null
done
stage done

"""The varlen prefill attention allele alone, on a GPU: microseconds a call, per shape and tiling.

    python -m tools.probes.prefill_attention_bench [--blocks-m 16 32 64 128] [--blocks-n 16 32 64] [--stages 1 2 3]
        [--warps 4 8] [--shapes long Qwen3]

Each shape is a call's packed prompts as the prefill-graphs engine passes them: q, k, v
strided views of one fused projection, and (captured calls) the prompts' starts and lengths
in buffers of MAX_PREFILL_PROMPTS slots, the grid covering the whole bucket; the 1B-class
prefill runs eagerly, its grid sized by the longest prompt. Each tiling (rows and keys a
block, pipeline stages, warps; run through the allele's own launch, its constants set, so
only tilings it can run) is checked against SDPA in fp32 over each prompt, then
captured in a CUDA graph and replayed 50 times; the allele's own tiling is timed first.
"""
import argparse
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import triton

from mutations.alleles import load_module as load_allele
from tools.probes.graph_timing import time_graph

SLOTS = 16  # MAX_PREFILL_PROMPTS of the prefill-graphs engine
NO_ROUNDING = SimpleNamespace(reference_rounding=False)  # all varlen prefill reads of a cache
# (name, prompt lengths, query heads, K/V heads, head_dim, bucket: None when run eagerly)
SHAPES = [("public prefill 4x128", [128] * 4, 4, 4, 192, 512), ("public mixed 4x64", [64] * 4, 4, 4, 192, 256),
          ("public mixed 4x32", [32] * 4, 4, 4, 192, 128), ("head_dim 256, 4x128", [128] * 4, 4, 4, 256, 512),
          ("1B 4x1024 (eager group)", [1024] * 4, 32, 4, 64, None),
          # Shapes nobody tuned the tiling for (eager: above MAX_PREFILL_TOKENS): the long_prompts
          # target's packed prefill, and the real checkpoints' 16 x 1024 (issues 26 and 27).
          ("long_prompts 2x4096", [4096] * 2, 6, 6, 128, None),
          ("Llama-3.2-1B 16x1024", [1024] * 16, 32, 8, 64, None),
          ("Qwen3-0.6B 16x1024", [1024] * 16, 16, 8, 128, None)]


def make_call(lengths, heads, kv_heads, head_dim, bucket):
    """(q, k, v, step, size): views of one [size, (heads + 2 kv_heads) * head_dim] projection."""
    total = sum(lengths)
    size = bucket or total
    qkv = torch.randn(size, (heads + 2 * kv_heads) * head_dim, device="cuda", dtype=torch.float16)
    q, k, v = (t.view(size, -1, head_dim) for t in qkv.split([heads * head_dim, kv_heads * head_dim,
                                                              kv_heads * head_dim], dim=-1))
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    slots = SLOTS if bucket else len(lengths)
    pad = [0] * (slots - len(lengths))
    step = SimpleNamespace(num_new=lengths, prompt_starts=torch.tensor(starts + pad, device="cuda"),
                           prompt_lengths=torch.tensor(lengths + pad, device="cuda"),
                           longest_prompt=None if bucket else max(lengths))
    return q, k, v, step


def reference(q, k, v, lengths):
    outs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (t[start:start + n].transpose(0, 1).float() for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0),
                                                   is_causal=True).transpose(0, 1))
        start += n
    return torch.cat(outs)


def launch(module, q, k, v, step, block_m, block_n, stages, warps):
    """The allele's own attend_prefill over the call with this tiling (its constants set for
    the call, then restored); out [N, heads, D]."""
    tiling = {"PREFILL_BLOCK_M": block_m, "PREFILL_BLOCK_N": block_n, "PREFILL_STAGES": stages,
              "PREFILL_WARPS": warps // 2 if block_m > 64 else warps}  # it doubles the warps past 64 queries
    saved = {name: getattr(module, name) for name in tiling}
    vars(module).update(tiling)
    try:
        return module.attend_prefill(q, k, v, NO_ROUNDING, 0, step).view_as(q)
    finally:
        vars(module).update(saved)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks-m", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--blocks-n", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--shapes", nargs="+", help="only the shapes whose names contain one of these")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    module = load_allele("attend_prefill", "triton_varlen")
    rows = []
    for name, lengths, heads, kv_heads, head_dim, bucket in SHAPES:
        if args.shapes and not any(part in name for part in args.shapes):
            continue
        q, k, v, step = make_call(lengths, heads, kv_heads, head_dim, bucket)
        total = sum(lengths)
        want = reference(q[:total], k[:total], v[:total], lengths)
        allele_us = time_graph([lambda: module.attend_prefill(q, k, v, NO_ROUNDING, 0, step)])
        row = {"shape": name, "allele_us": round(allele_us, 2)}
        timings = {}
        for block_m, block_n, stages, warps in itertools.product(args.blocks_m, args.blocks_n, args.stages, args.warps):
            if block_m > 64 and warps % 2:
                continue  # not a tiling the allele can run
            fn = lambda: launch(module, q, k, v, step, block_m, block_n, stages, warps)  # noqa: E731
            try:
                got = fn()[:total].float()
            except triton.runtime.errors.OutOfResources:
                continue
            error = ((got - want).norm() / want.norm()).item()
            assert error < 2e-3, (name, block_m, block_n, stages, warps, error)
            timings[f"{block_m}x{block_n} s{stages} w{warps}"] = round(time_graph([fn]), 2)
        best = sorted(timings.items(), key=lambda item: item[1])[:5]
        row.update(best=best, timings=timings)
        print(json.dumps({k: row[k] for k in ("shape", "allele_us", "best")}), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

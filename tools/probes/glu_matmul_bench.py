"""A decode's gate/up projection and SwiGLU in one Triton kernel against cuBLAS and the swiglu
allele's kernel after it, on a GPU: microseconds a call, per shape, row count and tiling.

    python -m tools.probes.glu_matmul_bench [--configs llama_3_2_1b qwen3_0_6b] [--rows 16 64]
        [--dtype bfloat16] [--rounds 3]

At a few dozen rows the engines run gate/up through cuBLAS, then `swiglu_kernel` (a launch
of its own, ~2.6 us a layer at Llama-3.2-1B's 64 rows on an H100:
docs/log/2026-11-27-judge-runner-checksum-graphs-allocator.md). Here
mlp.glu_matmul's kernel computes both halves' columns in one program and writes
silu(gate) * up: the launch and the [rows, 2 x intermediate] round trip go, if its tiles read
the weight as fast as cuBLAS's; each of TILINGS is timed (the allele's GLU_BLOCK_N,
GLU_BLOCK_K and GLU_STAGES). Each way is captured in a CUDA graph over enough
weight copies to overflow the L2 (tools.probes.linear_bench's method), checked against fp32
first, and timed `--rounds` times with the ways in turn (medians).
"""
import argparse
import itertools
import json
import statistics

import torch
import triton

from mutations.alleles import load_module as load_allele
from tools.probes.linear_bench import CONFIGS, DTYPES, L2_BYTES, checked, time_calls

TILINGS = list(itertools.product((16, 32, 64), (64, 128), (3, 4)))  # BLOCK_N, BLOCK_K, stages


def tiled(glu, block_n, block_k, stages):
    """The allele's module with its launch constants set."""
    glu.GLU_BLOCK_N, glu.GLU_BLOCK_K, glu.GLU_STAGES = block_n, block_k, stages
    return glu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["llama_3_2_1b", "qwen3_0_6b", "one_b"],
                        choices=list(CONFIGS))
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=3, help="times each way is timed, the ways in turn")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    swiglu = load_allele("mlp", "swiglu_triton")
    glu = load_allele("mlp", "glu_matmul")
    for config in args.configs:
        hidden, intermediate = CONFIGS[config][0], CONFIGS[config][3]
        copies = max(1, -(-L2_BYTES // (2 * intermediate * hidden * 2)))
        weights = [torch.randn(2 * intermediate, hidden, device="cuda", dtype=dtype) * 0.02 for _ in range(copies)]
        for num_rows in args.rows:
            x = torch.randn(num_rows, hidden, device="cuda", dtype=dtype)
            gate, up = (x.float() @ weights[0].float().T).chunk(2, dim=-1)
            want = torch.nn.functional.silu(gate) * up

            def cublas_then_swiglu(w):  # the engines' way: the product over the gate half, in place
                gate_up = x @ w.T
                swiglu.swiglu_kernel[(num_rows, triton.cdiv(intermediate, swiglu.SWIGLU_BLOCK))](
                    gate_up, gate_up, gate_up.stride(0), gate_up.stride(0), intermediate, BLOCK=swiglu.SWIGLU_BLOCK,
                    num_warps=swiglu.SWIGLU_WARPS)
                return gate_up[:, :intermediate]

            ways = {"cublas_swiglu": cublas_then_swiglu}
            for block_n, block_k, stages in TILINGS:
                ways[f"glu_{block_n}x{block_k}_s{stages}"] = \
                    lambda w, n=block_n, k=block_k, s=stages: tiled(glu, n, k, s).glu_matmul(x, w)
            times = {}
            for _ in range(args.rounds):
                for way, fn in ways.items():
                    if way not in times:
                        try:
                            checked(fn, weights[0], want)
                        except triton.runtime.errors.OutOfResources:
                            continue
                    times.setdefault(way, []).append(time_calls(fn, weights))
            row = {"config": config, "dtype": args.dtype, "rows": num_rows, "intermediate": intermediate,
                   "hidden": hidden, **{way + "_us": round(statistics.median(runs), 2) for way, runs in times.items()}}
            fused = {way: us for way, us in row.items() if way.startswith("glu_")}
            row["best_glu"] = min(fused, key=fused.get) if fused else None
            print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Skinny matmuls on a GPU: cuBLAS against tools.probes.skinny_matmul's kernels, microseconds a projection.

    python -m tools.probes.linear_bench [--rows 1 8 64] [--configs public one_b] [--dtype bfloat16]
        [--projs lm_head down] [--rounds 3] [--sweep] [--json OUT]

For each projection of the public, 12-layer and 1B-class configs and of the Llama-3.2-1B
and Qwen3-0.6B shapes (q/k/v stacked, o, gate/up stacked, down, lm_head) and each row count:
cuBLAS on `x @ w.T` and on a weight stored transposed (`x @ wt`); cuBLASLt, through `addmm`
with a zero bias (its epilogue path, `lt_bias`) and as torch's preferred library (`lt`), whose
heuristics may pick other tiles for a skinny product; `skinny_matmul` with its
plan (`--sweep`: every setting, the best named); `prefetched_matmul` without and with
programmatic dependent launch, and at one row also through a tensor-core tile and in one
share of the whole inner dimension (fewer columns a program, no second kernel). Each way is
captured in a CUDA graph over enough copies of the weight to overflow the L2 cache (a decode
step reads every layer's weights from memory once), one call after another as a step's
kernels run, and replayed; microseconds a call and the weight's bytes over them (GB/s).
Every way's output is checked against fp32 first. With --rounds R each way is timed R times,
the ways taking turns, and the median printed: the first way timed after a large weight is
made read ~10% slow on an H100 (Llama's lm_head), and turns spread that over every way.
"""
import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
import triton

from tools.probes import skinny_matmul as kernels
from tools.probes.graph_timing import time_graph

CONFIGS = {  # hidden, query width, K/V width, intermediate, vocab
    "public": (768, 768, 768, 3072, 6000),
    "twelve_layer": (768, 768, 768, 3072, 4096),
    "one_b": (2048, 2048, 256, 5632, 32000),
    "llama_3_2_1b": (2048, 2048, 512, 8192, 128256),
    "qwen3_0_6b": (1024, 2048, 1024, 3072, 151936),
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
L2_BYTES = 256 << 20  # weight copies a graph cycles through: far above an H100's 50 MB of L2


def projections(hidden, q_width, kv_width, intermediate, vocab) -> dict:
    """name -> (out, in) of each weight a layer (and the head) multiplies by."""
    return {"qkv": (q_width + 2 * kv_width, hidden), "o": (hidden, q_width),
            "gate_up": (2 * intermediate, hidden), "down": (hidden, intermediate), "lm_head": (vocab, hidden)}


def time_calls(fn, weights, replays=10) -> float:
    """Microseconds a call of fn(w), once per weight copy, one after another in one graph."""
    return time_graph([lambda w=w: fn(w) for w in weights], replays)


def checked(fn, weight, want) -> None:
    got = fn(weight).float()
    error = ((got - want).norm() / want.norm()).item()
    assert error < (2e-3 if weight.dtype == torch.float16 else 8e-3), error  # bf16 rounds to 8 bits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--dtype", default="float16", choices=list(DTYPES))
    parser.add_argument("--projs", nargs="+", default=["qkv", "o", "gate_up", "down", "lm_head"])
    parser.add_argument("--rounds", type=int, default=1, help="times each way is timed, the ways in turn")
    parser.add_argument("--sweep", action="store_true", help="time every kernel setting too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows_out = []
    dtype = DTYPES[args.dtype]
    for config in args.configs:
        for name, (out, inner) in projections(*CONFIGS[config]).items():
            if name not in args.projs:
                continue
            copies = max(1, -(-L2_BYTES // (out * inner * 2)))
            weights = [torch.randn(out, inner, device="cuda", dtype=dtype) * 0.02 for _ in range(copies)]
            transposed = [w.T.contiguous() for w in weights]
            for num_rows in args.rows:
                x = torch.randn(num_rows, inner, device="cuda", dtype=dtype)
                want = x.float() @ weights[0].float().T
                plan = kernels.skinny_plan(num_rows, out, inner)
                bias = torch.zeros(out, device="cuda", dtype=dtype)
                ways = {"cublas": lambda w: x @ w.T, "lt_bias": lambda w: torch.addmm(bias, x, w.T),
                        "lt": lambda w: x @ w.T, "plan": lambda w, p=plan: kernels.skinny_matmul(x, w, *p)}
                for share in (512, 1024):
                    block_n, split_k = kernels.prefetch_plan(num_rows, out, inner, share)
                    for pdl in (False, True):
                        ways[f"prefetch{share}{'_pdl' if pdl else ''}"] = \
                            lambda w, b=block_n, s=split_k, p=pdl: kernels.prefetched_matmul(x, w, b, s, p)
                    if num_rows == 1:
                        ways[f"prefetch{share}_pdl_tile"] = \
                            lambda w, b=block_n, s=split_k: kernels.prefetched_matmul(x, w, b, s, True, one_row=False)
                if num_rows == 1:  # the whole inner dimension a program, in 16 x 1,024 elements: no second kernel
                    whole = max(1, min(16, 16 * 1024 // triton.next_power_of_2(inner)))
                    ways["one_share_pdl"] = lambda w, b=whole: kernels.prefetched_matmul(x, w, b, 1, True)
                row = {"config": config, "dtype": args.dtype, "proj": name, "rows": num_rows, "out": out, "in": inner,
                       "plan": list(plan)}
                ways["cublas_nn"] = lambda wt: x @ wt  # over the transposed copies
                times = {}
                for _ in range(args.rounds):
                    for way, fn in ways.items():
                        torch.backends.cuda.preferred_blas_library("cublaslt" if way == "lt" else "cublas")
                        over = transposed if way == "cublas_nn" else weights
                        if way not in times:
                            checked(fn, over[0], want)
                        times.setdefault(way, []).append(time_calls(fn, over))
                torch.backends.cuda.preferred_blas_library("cublas")
                for way, runs in times.items():
                    row[way + "_us"] = round(statistics.median(runs), 2)
                if args.sweep:
                    best = None
                    for block_n, block_k, split_k, stages in itertools.product((16, 32, 64), (64, 128, 256),
                                                                               (1, 2, 4, 8), (3, 5)):
                        if inner // split_k < block_k:
                            continue
                        fn = lambda w: kernels.skinny_matmul(x, w, block_n, block_k, split_k, 4, stages)
                        try:
                            checked(fn, weights[0], want)
                        except triton.runtime.errors.OutOfResources:
                            continue
                        us = time_calls(fn, weights, replays=5)
                        if best is None or us < best[0]:
                            best = (round(us, 2), [block_n, block_k, split_k, stages])
                    row["best_us"], row["best"] = best
                gb = out * inner * 2 / 1e3
                for key in [k for k in row if k.endswith("_us")]:
                    row[key.replace("_us", "_gbps")] = round(gb / row[key])
                print(json.dumps(row), flush=True)
                rows_out.append(row)
            del weights, transposed
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

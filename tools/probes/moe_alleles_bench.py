"""A sparse layer's MLP (`moe`) in the seed and with each MoE allele swapped in, on a CPU:
microseconds a call at a few row counts, one thread.

    python -m tools.probes.moe_alleles_bench [--rows 1 4 8 32 128 512] [--experts 8] [--top-k 2]
        [--hidden 128] [--inter 64]

The defaults are target/hf_checkpoints.py's tiny_qwen3_moe. Each program is the seed after one
swap (as the search makes it), its `moe` called on random fp32 rows over random weights;
calls are repeated until about 2,000 rows have gone through, after 5 untimed.
"""
import argparse
import random
import time

import torch

import mutations
from mutations import program

SWAPS = ("allele.route.fused_topk", "allele.experts_swiglu.routed_only", "allele.moe.gathered_bmm",
         "allele.moe.padded_bmm")


def namespace(source: str) -> dict:
    found = {}
    exec(compile(source, "program", "exec"), found)
    return found


def sparse_layer(experts, top_k, hidden, inter, gen) -> dict:
    def draw(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5
    return {"router": draw(experts, hidden), "experts_gate": draw(experts, inter, hidden),
            "experts_up": draw(experts, inter, hidden), "experts_down": draw(experts, hidden, inter),
            "top_k": top_k, "renormalise": True}


def time_call(moe, x, layer) -> float:
    """Microseconds a call."""
    for _ in range(5):
        moe(x, layer)
    reps = max(20, 2000 // x.shape[0])
    start = time.perf_counter()
    for _ in range(reps):
        moe(x, layer)
    return 1e6 * (time.perf_counter() - start) / reps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 32, 128, 512])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--inter", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seed = program.SEED_PATH.read_text()
    programs = {"seed": namespace(seed)}
    for name in SWAPS:
        programs[name.split(".")[-1]] = namespace(mutations.get_operator(name).apply(seed, random.Random(0)).source)
    gen = torch.Generator().manual_seed(0)
    layer = sparse_layer(args.experts, args.top_k, args.hidden, args.inter, gen)
    print("rows  " + "  ".join(f"{name:>12}" for name in programs))
    for rows in args.rows:
        x = torch.randn(rows, args.hidden, generator=gen)
        print(f"{rows:4d}  " + "  ".join(f"{time_call(p['moe'], x, layer):12.1f}" for p in programs.values()))


if __name__ == "__main__":
    main()

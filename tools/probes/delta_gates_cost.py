"""delta_gates.triton alone at Qwen3.5-35B-A3B's width (hidden 2048, 32 value heads), bf16, in
CUDA graphs as a decode step runs it: each setting of its knobs (heads a program,
DELTA_GATES_HEADS; hidden dims a step, DELTA_GATES_BLOCK), at each batch of rows, microseconds
a call over 30 layers' weights, the settings in turn twice. The first setting is the kernel's
former layout (a program per row for every head, 256 dims a step):

    python -m tools.probes.delta_gates_cost [--rows 1 64] [--settings 32:256 2:2048 4:2048 1:2048]
"""
import argparse

import torch

from mutations.alleles import load_module
from tools.probes.graph_timing import time_graph

LAYERS = 30  # Qwen3.5-35B-A3B's DeltaNet layers


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--settings", nargs="+", default=["32:256", "2:2048", "4:2048", "1:2048"],
                        help="HEADS:BLOCK")
    args = parser.parse_args(argv)
    gates = load_module("delta_gates", "triton")
    torch.manual_seed(0)
    layers = [{"a": torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16) / 45,
               "b": torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16) / 45,
               "A_log": torch.randn(32, device="cuda"), "dt_bias": torch.randn(32, device="cuda")}
              for _ in range(LAYERS)]
    settings = [tuple(map(int, s.split(":"))) for s in args.settings]
    for rows in args.rows:
        x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
        for heads, block in settings * 2:
            gates.DELTA_GATES_HEADS, gates.DELTA_GATES_BLOCK = heads, block
            us = time_graph([lambda lin=lin: gates.delta_gates(x, lin) for lin in layers])
            print(f"{rows} rows, {heads} heads a program, {block} dims a step: {us:.2f} us a call")


if __name__ == "__main__":
    main()

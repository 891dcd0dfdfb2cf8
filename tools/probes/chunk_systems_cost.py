"""chunk_systems.triton alone at Qwen3.5-35B-A3B's width (32 heads, keys and values of 128),
the chunks of 16 prompts of 1,024 tokens: each setting of its two knobs (A's rows from the
registers or from a scratch, SYSTEM_ROWS_FROM_MEMORY; the warps, SYSTEM_WARPS), the largest
difference from the first setting and the ms of a call, the settings in turn twice:

    python -m tools.probes.chunk_systems_cost [--chunks 256] [--repeat 10] [--warps 4 8]

(On a CPU, TRITON_INTERPRET=1 and --device cpu --chunks 2 --repeat 1 run it through Triton's
interpreter: the differences, not the times.)
"""
import argparse
import itertools
import time

import torch

from mutations.alleles import load_module


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=256, help="of 64 tokens, over every prompt")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    systems = load_module("chunk_systems", "triton")
    torch.manual_seed(0)
    shape = (32, args.chunks, 64)
    q, k = (torch.nn.functional.normalize(torch.randn(*shape, 128, device=args.device), dim=-1) for _ in range(2))
    v = torch.randn(*shape, 128, device=args.device)
    log_decay, beta = -torch.rand(*shape, device=args.device) / 4, torch.rand(*shape, device=args.device)
    settings = list(itertools.product((0, 1), args.warps))

    def run(rows_from_memory, warps):
        systems.SYSTEM_ROWS_FROM_MEMORY, systems.SYSTEM_WARPS = rows_from_memory, warps
        return systems.chunk_systems(q, k, v, log_decay, beta)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    first = run(*settings[0])
    for setting in settings[1:]:
        print(f"rows from memory {setting[0]}, {setting[1]} warps: largest difference from the first",
              [float((a - b).abs().max()) for a, b in zip(run(*setting), first)])
    for setting in settings * 2:
        run(*setting)  # compiled and warm before the clock
        sync()
        start = time.perf_counter()
        for _ in range(args.repeat):
            run(*setting)
        sync()
        print(f"rows from memory {setting[0]}, {setting[1]} warps: {(time.perf_counter() - start) / args.repeat * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

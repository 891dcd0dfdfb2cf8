"""The split-KV decode attention allele alone, on a GPU: microseconds a call, per shape and setting.

    python -m tools.probes.decode_attention_bench [--programs 256 512 1024] [--tile-bytes 2048 4096 8192]
        [--warps 4 8] [--stages 1 3] [--shapes Qwen3 Llama] [--rounds 3]

Each shape (the public config's decode batches; the 1B-class config's, Llama-3.2-1B's and
Qwen3-0.6B's batch of 1 and of 64; the long_prompts target's 4 requests of 2,048 tokens) is
a paged cache of random K/V with scattered pages; each call is captured in a CUDA graph, as
the graph engines run it, and replayed 200 times between CUDA events. The same call through
the reference's math (`table_attention`, SDPA over each request's pages) is timed beside it
for scale, and every setting's output is checked against it first. With --rounds R every
setting is timed R times, the settings taking turns, and the median is printed (the spread
beside it), so that a GPU's drift over the sweep falls on every setting alike.
"""
import argparse
import itertools
import json
import statistics
from types import SimpleNamespace

import torch

from mutations.alleles import load_module as load_allele
from tools.probes.graph_timing import time_graph

# (name, batch, query heads, K/V heads, head_dim, tokens a request holds, max_positions)
SHAPES = [("public decode", 8, 4, 4, 192, 48, 6000), ("public mixed", 8, 4, 4, 192, 130, 6000),
          ("1B batch 1", 1, 32, 4, 64, 192, 2048), ("1B batch 64", 64, 32, 4, 64, 300, 2048),
          ("Llama-3.2-1B batch 1", 1, 32, 8, 64, 192, 4096), ("Llama-3.2-1B batch 64", 64, 32, 8, 64, 300, 4096),
          ("Qwen3-0.6B batch 1", 1, 16, 8, 128, 192, 4096), ("Qwen3-0.6B batch 64", 64, 16, 8, 128, 300, 4096),
          ("long_prompts decode 4x2048", 4, 6, 6, 128, 2056, 8192)]
PAGE_SIZE = 16


def make_call(batch, heads, kv_heads, head_dim, tokens, max_positions):
    """(cache, step, q): every request `tokens` long, its pages scattered over the pool."""
    pages_each = -(-tokens // PAGE_SIZE)
    num_pages = 1 + batch * pages_each
    shape = (num_pages, PAGE_SIZE, kv_heads, head_dim)
    k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(2))
    order = torch.randperm(num_pages - 1, device="cuda") + 1
    table = order.view(batch, pages_each).contiguous()
    cache = SimpleNamespace(k=[k], v=[v], page_size=PAGE_SIZE, max_positions=max_positions, reference_rounding=False)
    step = SimpleNamespace(block_table=table, positions=torch.full((batch,), tokens - 1, device="cuda"))
    return cache, step, torch.randn(batch, heads, head_dim, device="cuda", dtype=torch.float16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--tile-bytes", type=int, nargs="+", default=[0],
                        help="bytes of K a tile holds a head, above the prefetching batches (0: the allele's)")
    parser.add_argument("--warps", type=int, nargs="+", default=[0],
                        help="DECODE_WARPS: warps a split up to head_dim 128, twice that at 256 (0: the allele's)")
    parser.add_argument("--stages", type=int, nargs="+", default=[0], help="pipeline stages (0: the allele's)")
    parser.add_argument("--shapes", nargs="+", default=[""], help="only the shapes whose name holds one of these")
    parser.add_argument("--rounds", type=int, default=1, help="times each setting is timed, settings in turn")
    args = parser.parse_args(argv)
    module = load_allele("attend_decode", "triton_split_kv")
    # setting -> (the allele's constants it sets, the values swept); stages and programs at batch 1
    # are PREFETCH_STAGES and PREFETCH_PROGRAMS
    settings = {"tile_bytes": (("DECODE_TILE_BYTES",), args.tile_bytes), "warps": (("DECODE_WARPS",), args.warps),
                "stages": (("DECODE_STAGES", "PREFETCH_STAGES"), args.stages),
                "programs": (("DECODE_PROGRAMS", "PREFETCH_PROGRAMS"), args.programs)}
    defaults = {constant: getattr(module, constant) for constants, _ in settings.values() for constant in constants}
    for shape_name, *shape in SHAPES:
        if not any(part in shape_name for part in args.shapes):
            continue
        cache, step, q = make_call(*shape)
        want = module.table_attention(q, cache, 0, step)
        reference_us = time_graph([lambda: module.table_attention(q, cache, 0, step)], 200)
        row = {"shape": shape_name, "reference_us": round(reference_us, 2)}
        times = {}  # setting -> us of each round
        for _ in range(args.rounds):
            for values in itertools.product(*(choices for _, choices in settings.values())):
                key = " ".join(f"{name}={value}" for name, value in zip(settings, values)
                               if value or name == "programs")
                for (constants, _), value in zip(settings.values(), values):
                    for constant in constants:
                        setattr(module, constant, value or defaults[constant])
                if key in row:  # failed in round one
                    continue
                if key not in times:
                    try:
                        got = module.attend_decode(q, None, None, cache, 0, step)
                    except Exception as error:  # a tile too large for the SM's memory, say
                        row[key] = type(error).__name__
                        continue
                    error = (got.float() - want.float()).abs().max().item()
                    assert error < 1e-2, (shape_name, key, error)
                us = time_graph([lambda: module.attend_decode(q, None, None, cache, 0, step)], 200)
                times.setdefault(key, []).append(us)
        for key, runs in times.items():
            row[key] = round(statistics.median(runs), 2)
            if len(runs) > 1:
                row[key + " spread"] = [round(min(runs), 2), round(max(runs), 2)]
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

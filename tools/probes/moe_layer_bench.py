"""The MoE part of a layer alone on a GPU (route.triton_topk, then moe.triton_grouped's kernels),
knob by knob: microseconds a layer and the bandwidth it reaches, in CUDA graphs.

    python -m tools.probes.moe_layer_bench [--rows 1 64] [--layers 8] [--top 8] [--quick]
        [--experts 128 --inter 768]

Qwen3-30B-A3B's sparse layer (128 experts of 768, top 8, hidden 2048), random bf16;
`--experts 256 --inter 512` is Qwen3.5-35B-A3B's (its shared expert not included). `--layers`
distinct layers' weights are called one after another in one graph (8 layers: 4.8 GB, far
past the L2), and the replay's time is divided by them. Bytes a layer: the router and the
experts its rows reach (counted from the routing, not assumed). For each row count, every
combination of the knobs of the bucket it falls in is timed (median of 20 replays after 3),
after the parts alone at the allele's defaults: route (router matmul and top-k), the two
expert kernels with the sum over each token's k outputs (at a pair-at-a-time row count, the
tiles too), and the sum alone. A prefill's row
count (past MOE_HISTOGRAM_PAIRS pairs) also prints the TFLOP/s of the two kernels' products.
"""
import argparse
import itertools
import json
import statistics

import torch

from mutations.alleles import load_module as load_allele

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
GRIDS = {  # bucket -> knob -> values tried
    "PAIR": {"BLOCK_N": (2, 4, 8), "WARPS": (4, 8), "DOWN_BLOCK_N": (1, 2, 4), "DOWN_WARPS": (4, 8)},
    "FEW": {"BLOCK_M": (16,), "BLOCK_N": (16, 32, 64), "BLOCK_K": (64, 128, 256), "WARPS": (2, 4),
            "STAGES": (2, 3, 4)},
    # At 64 rows an expert has 2-4 pairs: BLOCK_M 16 was fastest on both shapes. The fastest N
    # was 32 on Qwen3-30B-A3B and 128 (K 128, the old grid's largest) on Qwen3.5's layer
    # (docs/log/2026-11-28-moe-triton-alleles-first-gpu-figures.md, 2026-11-29-hybrid-chunk-systems-in-triton.md)
    "MANY": {"BLOCK_M": (16,), "BLOCK_N": (32, 64, 128, 256), "BLOCK_K": (64, 128, 256), "WARPS": (4, 8),
             "STAGES": (3, 4)},
    "SORTED": {"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (32, 64), "WARPS": (4, 8), "STAGES": (3, 4)},
}


def sparse_layers(count, gen, experts, inter):
    def draw(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) / shape[-1] ** 0.5
    return [{"router": draw(experts, HIDDEN), "experts_gate": draw(experts, inter, HIDDEN),
             "experts_up": draw(experts, inter, HIDDEN), "experts_down": draw(experts, HIDDEN, inter),
             "top_k": TOP_K, "renormalise": True} for _ in range(count)]


def graph_us(fn, replays=20) -> float:
    """Median microseconds of one replay of a graph of fn()."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def bucket(module, rows) -> str:
    pairs = rows * TOP_K
    if pairs <= module.MOE_PAIR_PAIRS:
        return "PAIR"
    return "FEW" if pairs <= module.MOE_FEW_PAIRS else "MANY" if pairs <= module.MOE_HISTOGRAM_PAIRS else "SORTED"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--top", type=int, default=8, help="knob settings printed per row count, fastest first")
    parser.add_argument("--quick", action="store_true", help="the defaults and the parts only")
    parser.add_argument("--experts", type=int, default=EXPERTS)
    parser.add_argument("--inter", type=int, default=INTER)
    args = parser.parse_args(argv)
    module = load_allele("moe", "triton_grouped")
    module.route = load_allele("route", "triton_topk").route
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers = sparse_layers(args.layers, gen, args.experts, args.inter)
    for rows in args.rows:
        xs = [torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in layers]
        routes = [module.route(x, layer) for x, layer in zip(xs, layers)]
        reached = [len(set(experts.flatten().tolist())) for _, experts in routes]
        layer_bytes = 2 * (args.experts * HIDDEN + statistics.mean(reached) * 3 * args.inter * HIDDEN)
        flops = 2 * rows * TOP_K * 3 * args.inter * HIDDEN  # the two kernels' products
        name = bucket(module, rows)

        def per_layer(fn):
            return graph_us(lambda: [fn(x, layer) for x, layer in zip(xs, layers)]) / len(layers)

        def line(label, us, **extra):
            compute_bound = name == "SORTED" and label.startswith("experts")
            rate = {"TFLOP_per_s": round(flops / us / 1e6, 1)} if compute_bound else {}
            print(json.dumps({"rows": rows, "what": label, "us_a_layer": round(us, 2),
                              "TB_per_s": round(layer_bytes / us / 1e6, 3), **rate, **extra}))
        line("moe defaults", per_layer(module.moe), experts_reached=statistics.mean(reached), bucket=name)
        line("route", per_layer(module.route))
        grouped = [lambda x, layer, r=r: module.grouped_experts(x, *r, layer) for r in routes]
        line("experts (two kernels and the sum)",
             graph_us(lambda: [g(x, layer) for g, x, layer in zip(grouped, xs, layers)]) / len(layers))
        if name == "PAIR":
            module.MOE_PAIR_PAIRS, by_pair = 0, module.MOE_PAIR_PAIRS
            line("experts, tiles (a pair at a time off)",
                 graph_us(lambda: [g(x, layer) for g, x, layer in zip(grouped, xs, layers)]) / len(layers))
            module.MOE_PAIR_PAIRS = by_pair
        outs = [torch.randn(rows * TOP_K, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in layers]
        line("the sum alone", graph_us(lambda: [o.view(rows, TOP_K, HIDDEN).sum(1) for o in outs]) / len(layers))
        for name in ([] if args.quick or name not in GRIDS else [name]):
            grid, results = GRIDS[name], []
            defaults = {knob: getattr(module, f"MOE_{name}_{knob}") for knob in grid}
            for values in itertools.product(*grid.values()):
                knobs = dict(zip(grid, values))
                for knob, value in knobs.items():
                    setattr(module, f"MOE_{name}_{knob}", value)
                try:
                    us = graph_us(lambda: [g(x, layer) for g, x, layer in zip(grouped, xs, layers)]) / len(layers)
                except Exception as err:  # a setting Triton cannot compile (shared memory): noted, skipped
                    print(json.dumps({"rows": rows, "knobs": knobs, "error": str(err)[:120]}))
                    continue
                results.append((us, knobs))
            for knob, value in defaults.items():
                setattr(module, f"MOE_{name}_{knob}", value)
            for us, knobs in sorted(results, key=lambda r: r[0])[:args.top]:
                line(f"experts, {name} knobs", us, knobs=knobs)


if __name__ == "__main__":
    main()

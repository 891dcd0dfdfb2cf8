"""The Gated DeltaNet prefill's inputs put into its padded chunk layout: the torch passes
(the seed's delta_rule_inputs, then index_copy and a transpose per tensor) against
delta_net_prefill.triton_chunked's padded_inputs_kernel, at Qwen3.5-35B-A3B's width (16 key
and 32 value heads of 128), bf16, 16 prompts of 1,024 tokens; the largest difference and
the ms of each, in turn (docs/log/2026-11-29-delta-padded-inputs-kernel.md):

    python -m tools.probes.delta_inputs_cost [--prompts 16] [--length 1024] [--repeat 10]
"""
import argparse
import time

import torch

from contract.loader import SEED_ENGINE, load_engine_module
from mutations.alleles import load_module

LIN = {"key_heads": 16, "value_heads": 32, "key_dim": 128, "value_dim": 128}
CHUNK = 64


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    chunked, seed = load_module("delta_net_prefill", "triton_chunked"), load_engine_module(SEED_ENGINE)
    heads, lengths = LIN["value_heads"], [args.length] * args.prompts
    rows_total = sum(lengths)
    x = torch.randn(rows_total, 8192, device="cuda", dtype=torch.bfloat16)
    log_decay, beta = -torch.rand(rows_total, heads, device="cuda") / 4, torch.rand(rows_total, heads, device="cuda")
    count = torch.tensor([-(-n // CHUNK) for n in lengths])
    first, chunks = count.cumsum(0) - count, int(count.sum())
    rows = torch.cat([torch.arange(n) + CHUNK * f for n, f in zip(lengths, first.tolist())]).cuda()

    def in_torch():
        q, k, v = seed.delta_rule_inputs(x, LIN)

        def padded(t):
            whole = t.new_zeros(chunks * CHUNK, *t.shape[1:]).index_copy_(0, rows, t)
            return whole.transpose(0, 1).reshape(heads, chunks, CHUNK, *t.shape[2:]).contiguous()
        return [padded(t) for t in (q, k, v, log_decay, beta)]

    def in_one_kernel():
        return list(chunked.padded_inputs(x, log_decay, beta, LIN, rows, chunks))

    print("largest difference", [float((a - b).abs().max()) for a, b in zip(in_torch(), in_one_kernel())])
    for name, run in (("torch", in_torch), ("kernel", in_one_kernel)) * 2:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.repeat):
            run()
        torch.cuda.synchronize()
        print(f"{name}: {(time.perf_counter() - start) / args.repeat * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

"""SwiGLU with gate and up from one matmul, and silu(gate) * up in one Triton kernel.

`mlp.fused` runs `F.silu(gate) * up` as two elementwise kernels, each a full pass over the
[N, intermediate] activations: on an H100 a 1B-class prefill of 16 x 1024 tokens spent
2 x 265 us a layer in them (docs/log/2026-11-23-gqa-split-kv-decode-kernel.md), and a
decode step two launches a layer. Here one launch reads gate and up once and writes the
product, with the reference's two ops' own arithmetic: silu as torch's CUDA kernel computes
it (fp32, CUDA's expf, an IEEE-rounded division) rounded to the compute dtype, then the
product rounded again. So bf16 takes the kernel too: on bf16 checkpoints torch's two
elementwise kernels cost 2 x 37 us a layer of a 16 x 1024 prefill on the Qwen3-0.6B shape
(H200, docs/log/2026-11-26-step-time-20-minute-searches-real-shapes.md). Triton's
interpreter has no libdevice, so on CPU the exponential is tl.exp.
The product overwrites the gate half in place (each program reads its gate and up before it
writes): the down projection reads it through its row stride, and no [N, intermediate]
tensor is allocated (on a 1B-class prefill of 4,096 tokens, 44 MB of peak memory).

One row (a batch-1 decode) folds the product into the down projection: each program loads
its columns' share of the down weight first (no kernel before it writes a weight), waits for
the kernel before it under programmatic dependent launch, then computes the whole row's
product with the same arithmetic and sums it against its columns in fp32, rounded once as a
matmul is. A launch a layer fewer: on an H100 Qwen3-0.6B's batch-1 step (intermediate
3,072) gained, while Llama-3.2-1B's (8,192) lost 0.23 ms, each program recomputing a product
twice as wide for fewer columns (docs/log/2026-11-26-one-row-folds-llama-qwen3-step.md): hence
FOLD_WIDTH.

The kernels and `swiglu`, the MLP after its first projection, are in shared.py, with their
arithmetic (`silu_times`), which norm_mlp.folded's one-row projection computes in its own
programs.
"""
REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "cuda"


def mlp(x, layer):
    return swiglu(x @ layer["gate_up"].T, layer)
